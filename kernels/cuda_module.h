/* The boundary between rvd and its CUDA module, librvd_cuda.so: plain C,
 * versioned.
 *
 * Why a module at all: cuBLAS, cuBLASLt and cuSOLVER carry about 150 KB of
 * static thread-local storage. Linked into the daemon, every new thread must
 * fit it into its stack, and civetweb (prometheus-cpp's HTTP server) starts
 * its threads with a small fixed stack: pthread_create fails and /metrics
 * cannot start. dlopen'ed, the TLS is dynamic and the problem is gone; one
 * rvd binary also serves hosts without a GPU (backend auto falls back to the
 * CPU engine when the module or a device is missing).
 *
 * Why C: the daemon and the module are built separately and may be
 * installed from different builds. Nothing of C++ (no std::string, no
 * vtable, no exception) crosses: only these structs and function pointers,
 * and the module says which ABI it speaks before anything is created. A
 * daemon refuses a module of another ABI version with a clear error.
 *
 * Rules for changing it: add fields only at the end of rvd_cuda_module (the
 * daemon checks `size`); change anything else and bump
 * RVD_CUDA_MODULE_ABI_VERSION.
 *
 * Thread safety: every function may be called from any thread; compute may
 * run concurrently on one engine. */
#ifndef RVD_KERNELS_CUDA_MODULE_H_
#define RVD_KERNELS_CUDA_MODULE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 2: compute takes an rvd_call (ordering event and cancellation flag).
 * 3: rvd_matrix carries a blocked view's block_rows and block_stride. */
#define RVD_CUDA_MODULE_ABI_VERSION 3u
/* The one symbol the module exports: a function returning its table. */
#define RVD_CUDA_MODULE_SYMBOL "rvd_cuda_module_table"

typedef struct rvd_cuda_engine rvd_cuda_engine; /* opaque */

/* Where a matrix's bytes live. */
enum rvd_memory { RVD_MEMORY_HOST = 0, RVD_MEMORY_DEVICE = 1 };
/* Element types, as rvd::DType. */
enum rvd_dtype { RVD_DTYPE_F32 = 0, RVD_DTYPE_F16 = 1, RVD_DTYPE_BF16 = 2 };

/* A row-major matrix: element (i, j) at data + (i * ld + j) * element size;
 * blocked (block_rows > 0, device memory only) as rvd::MatrixView: row i at
 * (i / block_rows) * block_stride + (i % block_rows) * ld elements. */
typedef struct rvd_matrix {
  const void* data;
  int64_t rows, cols, ld;
  int32_t dtype;  /* enum rvd_dtype */
  int32_t memory; /* enum rvd_memory; one kind per call */
  int64_t block_rows;   /* 0: one strided matrix */
  int64_t block_stride; /* elements between block starts */
} rvd_matrix;

typedef struct rvd_variant {
  const char* name; /* "" or NULL: the module's default */
  int32_t probes;
  int32_t sketch_rank;
  uint64_t seed;
  int32_t hutch_plus_plus;
} rvd_variant;

/* A call's outcome: code is absl's (and gRPC's) canonical numbering, 0 OK. */
typedef struct rvd_status {
  int32_t code;
  char message[1024]; /* NUL-terminated, truncated to fit */
} rvd_status;

/* What one compute call may be ordered after and stopped by. */
typedef struct rvd_call {
  /* Device matrices: a cudaEvent_t the engine's work waits for, or NULL. */
  void* ready;
  /* NULL, or a flag the caller sets (from any thread) to stop the call: the
   * module reads it at its checkpoints (before each chunk and each launch)
   * and answers CANCELLED (code 1). It is a C++ std::atomic<bool> (C11
   * atomic_bool: one byte, lock-free, the same object on both sides), read
   * with an atomic load; it must outlive the call. */
  const void* cancel;
} rvd_call;

typedef struct rvd_cuda_options {
  int32_t device;
  int32_t streams;
  uint64_t max_device_bytes;
  int32_t max_sms; /* 0: every SM */
} rvd_cuda_options;

/* Receives one value of an engine's stats: `kind` is "served", "event",
 * "phase_seconds", "device_error", "device_bytes", "pinned_bytes", "policy"
 * (value 1, key "technique=knobs"); `key` names the entry. */
typedef void (*rvd_stats_sink)(void* sink_ctx, const char* kind, const char* key, double value);

typedef struct rvd_cuda_module {
  uint32_t abi_version; /* RVD_CUDA_MODULE_ABI_VERSION of the module's build */
  uint32_t size;        /* sizeof(rvd_cuda_module) of the module's build */
  const char* build;    /* the module's rvd version, for the log */

  /* NULL on failure, with *status saying why (no device, too old a GPU). */
  rvd_cuda_engine* (*create)(const rvd_cuda_options* options, rvd_status* status);
  void (*destroy)(rvd_cuda_engine* engine);
  /* The kernel version string; valid as long as the engine. */
  const char* (*version)(rvd_cuda_engine* engine);
  /* PR of each matrix into out[0..n), ordered and cancellable by `call`
   * (NULL: neither). Returns status->code. */
  int32_t (*compute)(rvd_cuda_engine* engine, const rvd_matrix* batch, size_t n,
                     const rvd_variant* variant, double* out, const rvd_call* call,
                     rvd_status* status);
  void (*stats)(rvd_cuda_engine* engine, rvd_stats_sink sink, void* sink_ctx);
  /* NULL when the device is usable, else why not (valid until destroy). */
  const char* (*lost)(rvd_cuda_engine* engine);
  /* Page-locked host memory (NULL if unavailable), and its release. */
  void* (*alloc_host)(rvd_cuda_engine* engine, uint64_t bytes);
  void (*free_host)(rvd_cuda_engine* engine, void* p);
} rvd_cuda_module;

typedef const rvd_cuda_module* (*rvd_cuda_module_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* RVD_KERNELS_CUDA_MODULE_H_ */
