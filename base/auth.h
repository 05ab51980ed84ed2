// Proof of a shared secret without sending it: HMAC-SHA-256 over a fresh challenge. The store and
// every tcp connection use it, so that nobody without the job's secret (in the unique id, or in
// BRAID_SECRET) can join a job or take a rank's place, and a recorded answer is useless later.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace braid::auth {

using Digest = std::array<std::uint8_t, 32>;

Digest sha256(const void* data, std::size_t n);
Digest hmacSha256(const std::string& key, const std::string& message);
// Compares in time independent of where the inputs differ.
bool equal(const Digest& a, const Digest& b);
// 16 random bytes from the kernel, as a string (a challenge).
std::string randomBytes(std::size_t n = 16);
std::string toHex(const void* data, std::size_t n);

}  // namespace braid::auth
