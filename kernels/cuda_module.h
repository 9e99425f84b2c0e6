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
 * 3: rvd_matrix carries a blocked view's block_rows and block_stride.
 * 4: live weights (CUDA IPC segments and events, rvd-owned device memory,
 *    snapshots with weight deltas) and the Gram eigenvalues. */
#define RVD_CUDA_MODULE_ABI_VERSION 5u
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

/* ---- Live weights (ABI 4) ------------------------------------------------
 * A trainer on the same GPU shares its V weights once through CUDA IPC; rvd
 * maps each memory segment once (ipc_open), and on every step notification
 * copies the V set into device memory of its own (snapshot_start), ordered
 * after the trainer's interprocess event and followed by an interprocess
 * event of rvd's own that the trainer waits on before its next weight
 * update; then it computes from the copy (compute, RVD_MEMORY_DEVICE)
 * while training goes on. */

/* How a producer shared a memory segment. */
enum rvd_ipc_kind {
  /* A cudaIpcMemHandle_t (64 bytes) of a cudaMalloc'ed block: PyTorch's
   * handle of type 'c' (the 64 bytes after its 2-byte prefix), or raw. */
  RVD_IPC_CUDA_MALLOC = 0,
  /* PyTorch's expandable segment, handle of type 'e' (the bytes after its
   * 2-byte prefix): a header naming the producer's pid, the segment size
   * and the number of physical handles, which are POSIX file descriptors of
   * the producer, taken with pidfd_open + pidfd_getfd (same user, or
   * CAP_SYS_PTRACE) and mapped with cuMemImportFromShareableHandle. */
  RVD_IPC_EXPANDABLE = 1
};

typedef struct rvd_ipc_segment_desc {
  int32_t kind; /* enum rvd_ipc_kind */
  const uint8_t* handle;
  uint32_t handle_bytes;
  int32_t producer_pid;   /* the process that shared it */
  uint64_t segment_bytes; /* what the producer says the segment holds */
} rvd_ipc_segment_desc;

typedef struct rvd_ipc_segment rvd_ipc_segment; /* opaque: one mapping */

/* One matrix of a snapshot: src (device memory, possibly a mapped segment,
 * possibly blocked) is copied into dst (dense: rows x cols, ld = cols, the
 * same dtype); with last != NULL (dense, the same shape: the previous
 * snapshot), the same pass sums ||src - last||_F^2 and ||last||_F^2. */
typedef struct rvd_snapshot_item {
  rvd_matrix src;
  void* dst;
  const void* last;
} rvd_snapshot_item;

typedef struct rvd_snapshot rvd_snapshot; /* opaque: one snapshot in flight */

typedef struct rvd_cuda_live {
  /* Maps a producer's segment into this process; *base and *bytes say
   * where and how much. NULL with *status on failure: a handle that does
   * not open (INVALID_ARGUMENT), a missing permission for pidfd_getfd
   * (PERMISSION_DENIED, the message naming it), a producer that is gone
   * (NOT_FOUND), a segment of another device (FAILED_PRECONDITION). */
  rvd_ipc_segment* (*ipc_open)(rvd_cuda_engine* engine, const rvd_ipc_segment_desc* desc,
                               void** base, uint64_t* bytes, rvd_status* status);
  /* Unmaps it; nothing of it may be in use (the caller fences first). */
  void (*ipc_close)(rvd_cuda_engine* engine, rvd_ipc_segment* segment);

  /* The device's UUID as nvidia-smi prints it ("GPU-8f0c...", at most 63
   * characters), NUL-terminated into out. Returns status->code. */
  int32_t (*device_uuid)(rvd_cuda_engine* engine, char out[64], rvd_status* status);

  /* A producer's interprocess event (a 64-byte cudaIpcEventHandle_t) opened
   * here: an opaque cudaEvent_t, or NULL with *status. */
  void* (*ipc_open_event)(rvd_cuda_engine* engine, const uint8_t handle[64], rvd_status* status);
  /* An interprocess event of rvd's own (disable-timing) and its handle for
   * the producer. */
  void* (*ipc_create_event)(rvd_cuda_engine* engine, uint8_t handle_out[64],
                            rvd_status* status);
  /* Releases an event from either function. */
  void (*event_destroy)(rvd_cuda_engine* engine, void* event);

  /* Device memory of rvd's own, charged to max_device_bytes (over it:
   * RESOURCE_EXHAUSTED), and its release. */
  void* (*alloc_device)(rvd_cuda_engine* engine, uint64_t bytes, rvd_status* status);
  void (*free_device)(rvd_cuda_engine* engine, void* p);

  /* Enqueues a snapshot and returns at once, without waiting for the GPU:
   * on a stream of rvd's, after `wait` (a cudaEvent_t, or NULL), copies
   * every item, then records `done` (a cudaEvent_t, or NULL). NULL with
   * *status on failure (nothing enqueued). */
  rvd_snapshot* (*snapshot_start)(rvd_cuda_engine* engine, const rvd_snapshot_item* items,
                                  size_t n, void* wait, void* done, rvd_status* status);
  /* Waits for a started snapshot, writes delta_sq[i] = ||src_i - last_i||_F^2
   * and last_sq[i] = ||last_i||_F^2 in float64 (0 for items without last),
   * and releases it; every snapshot started is finished exactly once.
   * Cancellable by `call` (the snapshot is still released). Returns
   * status->code. */
  int32_t (*snapshot_finish)(rvd_cuda_engine* engine, rvd_snapshot* snapshot, double* delta_sq,
                             double* last_sq, const rvd_call* call, rvd_status* status);
} rvd_cuda_live;

/* ---- Gram eigenvalues (ABI 4) -----------------------------------------
 * For activation statistics: the eigenvalues of the Gram of the smaller
 * side of m (the squared singular values of m), min(rows, cols) of them in
 * ascending order, in float64, into out. Returns status->code. */
typedef int32_t (*rvd_gram_eigenvalues_fn)(rvd_cuda_engine* engine, const rvd_matrix* m,
                                           double* out, const rvd_call* call,
                                           rvd_status* status);

/* ---- Tuning (ABI 5, issue 17) -----------------------------------------
 * What self_improve/'s tune loop needs from the GPU. A candidate is device
 * code only (self_improve/generator.h: kCandidateSignature); the module owns
 * every launch, buffer and timer. */
typedef struct rvd_tune_module rvd_tune_module; /* opaque: one loaded candidate */

typedef struct rvd_tune_device {
  int32_t sm;               /* exact architecture: 90 for sm_90 */
  char arch[16];            /* what NVRTC is given: "sm_90a" on Hopper */
  /* Measured ceilings, once per device of the process (the first call),
   * on the lowest-priority stream; 0 when not measured. DRAM: a 1 GiB
   * device-to-device copy, read plus written bytes, best of 3. fp32: an
   * FMA-chain kernel on every SM (NVRTC; 0 without it), best of 3. */
  double dram_bytes_per_s;
  double fp32_flop_per_s;
  uint64_t l2_bytes;
} rvd_tune_device;

typedef struct rvd_tune_run {
  /* In: the candidate's launch geometry (its "rvd-launch:" line; the grid
   * is capped at the engine's max_sms when that is set); grid 0:
   * one block per job. */
  uint32_t threads, smem_bytes, grid;
  /* In: timed launches after the checked one (0: the checked run only). */
  uint32_t timed_launches;
  /* In: the bits every output slot holds before the checked run. */
  uint64_t poison64;
  uint32_t poison32;
  /* Out (host, num_jobs each): the checked run's per-job sums, read from
   * output buffers allocated fresh for this call. */
  double* g2;
  double* trace;
  float* maxabs;
  /* Out (host, timed_launches of them): each timed launch's seconds, L2
   * flushed before it, the device synchronized before its end event. */
  double* seconds;
  /* Out: 1 when the inputs differ from the module's private copy afterwards. */
  int32_t input_written;
} rvd_tune_run;

typedef struct rvd_cuda_tune {
  int32_t (*device)(rvd_cuda_engine* engine, rvd_tune_device* out, rvd_status* status);
  /* NVRTC (libnvrtc, loaded at first use) for the device's exact arch, then
   * cuModuleLoadData. NULL on failure (INVALID_ARGUMENT: the source does
   * not compile, or has no rvd_tune_candidate). *log, when log is not NULL,
   * is NVRTC's log (malloc'ed; free it with free_log). */
  rvd_tune_module* (*compile)(rvd_cuda_engine* engine, const char* source, char** log,
                              rvd_status* status);
  void (*free_log)(char* log);
  /* Runs the candidate on batch (host matrices, not blocked, copied to the
   * device for this call) and jobs (num_jobs rvd::tune::TuneJob,
   * self_improve/candidate_abi.h). Returns status->code. */
  int32_t (*run)(rvd_cuda_engine* engine, rvd_tune_module* module, const rvd_matrix* batch,
                 size_t n, const void* jobs, size_t num_jobs, rvd_tune_run* io,
                 rvd_status* status);
  /* Unloads the module; waits for every launch of it first. */
  void (*release)(rvd_cuda_engine* engine, rvd_tune_module* module);
} rvd_cuda_tune;

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
  /* ABI 4. Either may be NULL: this module has no such feature (the daemon
   * answers UNIMPLEMENTED for it). */
  const rvd_cuda_live* live;
  rvd_gram_eigenvalues_fn gram_eigenvalues;
  /* ABI 5. NULL: this module cannot tune (tune jobs answer
   * FAILED_PRECONDITION). */
  const rvd_cuda_tune* tune;
} rvd_cuda_module;

typedef const rvd_cuda_module* (*rvd_cuda_module_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* RVD_KERNELS_CUDA_MODULE_H_ */
