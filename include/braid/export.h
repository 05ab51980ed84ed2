/* BRAID_EXPORT marks what libbraid.so exports: the C API of braid.h and the C++ API of braid.hpp,
 * ddp.hpp, status.hpp and types.hpp. Everything else in the library is compiled hidden
 * (-fvisibility=hidden) and a version script (libbraid.map) keeps the rest local, so programs and
 * shims (an NCCL-ABI libnccl.so.2 forwarding to Braid) see only these names. */
#ifndef BRAID_EXPORT_H_
#define BRAID_EXPORT_H_

#if defined(__cplusplus)
#define BRAID_EXPORT [[gnu::visibility("default")]] /* may follow [[nodiscard]] on a class */
#elif defined(__GNUC__) || defined(__clang__)
#define BRAID_EXPORT __attribute__((visibility("default")))
#else
#define BRAID_EXPORT
#endif

#endif /* BRAID_EXPORT_H_ */
