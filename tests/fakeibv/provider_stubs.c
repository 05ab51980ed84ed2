/* Stand-ins for the provider libraries perftest links against (libmlx5.so.1, libefa.so.1), so that
   loading perftest over fakeibv does not load the real ones, whose constructors register drivers
   through libibverbs' private API. Each call fails with EOPNOTSUPP: a fakeibv device is neither an
   mlx5 nor an EFA device, so perftest only reaches them when asked for their features. */
#include <errno.h>
#include <stddef.h>

#define STUB(name) \
  void* name(void) { errno = EOPNOTSUPP; return NULL; }

#ifdef FAKEIBV_MLX5
STUB(mlx5dv_create_qp)
STUB(mlx5dv_open_device)
STUB(mlx5dv_devx_general_cmd)
STUB(mlx5dv_create_mkey)
STUB(mlx5dv_destroy_mkey)
STUB(mlx5dv_qp_ex_from_ibv_qp_ex)
STUB(mlx5dv_crypto_login)
STUB(mlx5dv_dek_create)
STUB(mlx5dv_dek_destroy)
#else
STUB(efadv_create_qp_ex)
STUB(efadv_query_device)
#endif
