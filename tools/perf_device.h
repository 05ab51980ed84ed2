// `braid perf --device cuda`: the few CUDA calls the benchmark needs, behind an interface that also
// compiles without CUDA (every call then fails with a message saying so).
#pragma once
#include <cstddef>
#include <functional>
#include <string>

namespace braid::tools::device {

// Picks this rank's GPU (LOCAL_RANK modulo the device count, else device 0) and makes it current,
// before the communicator is created, so that Braid uses the same one. "" or why it failed.
std::string select();
// Device memory (zeroed), freed by release(). nullptr on failure (error() says why).
void* alloc(std::size_t bytes);
void release(void* p);
bool upload(void* dst, const void* src, std::size_t bytes);
bool download(void* dst, const void* src, std::size_t bytes);
// The stream the benchmark's calls are ordered with, and waiting for it.
void* stream();
bool sync(void* stream);
std::string error();
// -G: the calls `body` makes on `stream` captured into a CUDA graph (relaxed capture mode: Braid's
// proxy thread may use CUDA meanwhile), instantiated; launched by launch(), freed by releaseGraph().
// nullptr on failure (error() says why; a body that returned false fails it too).
void* capture(void* stream, const std::function<bool()>& body);
bool launch(void* graph, void* stream);
void releaseGraph(void* graph);
// "NVIDIA H200 (device 0)" or "".
std::string describe();

}  // namespace braid::tools::device
