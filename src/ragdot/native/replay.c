// ragdot's launch-program interpreter: replays a recorded prepared call's kernel launches on a stream.
//
// A program (written by ragdot/native/plan.py from a recorded call) is a list of kernel launches and zero
// fills over the call's buffers, given by index; a replay packs each kernel's parameters from the buffers'
// addresses (TMA tensor maps encoded per call with cuTensorMapEncodeTiled, as Triton's launcher does) and
// launches with cuLaunchKernelEx. Used by ragdot's eager PyTorch calls (ragdot/kernels/replay.py, through
// `ragdot_replay_run`) and by ragdot.jax's XLA FFI handler (ffi_launch.c includes this file).
//
// Program layout (int64 words):
//   n_steps, then per step one of
//     0 (kernel): function, grid x, y, z, threads, shared bytes, flags (1 PDL, 2 cooperative), n_params,
//                 then per parameter one of
//                   0 (pointer): buffer, byte offset
//                   1 (scalar):  bytes (1, 2, 4, 8), value
//                   2 (null pointer)
//                   3 (tensor map): buffer, byte offset, CUtensorMapDataType, rank, swizzle, oob fill,
//                                   dims[rank] (innermost first), byte strides[rank - 1], box[rank]
//     1 (zero):   buffer, byte offset, bytes

#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda.h"

#define MAX_PARAMS 64
#define MAX_MAPS 8

typedef CUresult (*launch_fn)(const CUlaunchConfig*, CUfunction, void**, void**);
typedef CUresult (*memset_fn)(CUdeviceptr, unsigned char, size_t, CUstream);
typedef CUresult (*encode_fn)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                              const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

static launch_fn launch = NULL;
static memset_fn memset_async = NULL;
static encode_fn encode = NULL;

// ---- replay ----------------------------------------------------------------------------------------------
static int load_driver(void) {
  if (launch != NULL) return 0;
  void* cuda = dlopen("libcuda.so.1", RTLD_LAZY);
  if (cuda == NULL) return -1;
  encode = (encode_fn)dlsym(cuda, "cuTensorMapEncodeTiled");
  memset_async = (memset_fn)dlsym(cuda, "cuMemsetD8Async");
  launch_fn found = (launch_fn)dlsym(cuda, "cuLaunchKernelEx");
  if (encode == NULL || memset_async == NULL || found == NULL) return -1;
  launch = found;
  return 0;
}

static const char* bad(char* message, int64_t size, const char* text) {
  snprintf(message, (size_t)size, "%s", text);
  return message;
}

// Replay `program` on `stream` over the buffers `ptrs`. With `trace` set nothing reaches the driver: each
// kernel's launch shape and packed parameters are written there instead (int64 words, for tests). Returns
// NULL, or the message of what went wrong (written into `message`).
const char* ragdot_replay(const int64_t* program, int64_t length, const uint64_t* ptrs, int64_t n,
                              uint64_t stream, int64_t* trace, int64_t trace_size, int64_t* traced,
                              char* message, int64_t size) {
  int64_t at = 0, written = 0;
#define NEXT() (at < length ? program[at++] : (at = length + 1, 0))
#define EMIT(v) do { if (written < trace_size) trace[written] = (int64_t)(v); written++; } while (0)
  if (trace == NULL && load_driver() != 0) return bad(message, size, "libcuda.so.1 or its launch entry points not found");
  int64_t steps = NEXT();
  for (int64_t s = 0; s < steps; s++) {
    int64_t kind = NEXT();
    if (kind == 1) {  // zero fill
      int64_t buffer = NEXT(), offset = NEXT(), bytes = NEXT();
      if (buffer < 0 || buffer >= n) return bad(message, size, "plan: buffer index out of range");
      uint64_t address = ptrs[buffer] + (uint64_t)offset;
      if (trace != NULL) {
        EMIT(-1); EMIT(address); EMIT(bytes);
      } else if (memset_async((CUdeviceptr)address, 0, (size_t)bytes, (CUstream)stream) != CUDA_SUCCESS) {
        return bad(message, size, "cuMemsetD8Async failed");
      }
      continue;
    }
    if (kind != 0) return bad(message, size, "plan: unknown step");
    CUfunction function = (CUfunction)(uintptr_t)NEXT();
    unsigned gx = (unsigned)NEXT(), gy = (unsigned)NEXT(), gz = (unsigned)NEXT();
    unsigned threads = (unsigned)NEXT(), shared = (unsigned)NEXT();
    int64_t flags = NEXT(), n_params = NEXT();
    if (n_params < 0 || n_params > MAX_PARAMS) return bad(message, size, "plan: too many parameters");
    void* params[MAX_PARAMS];
    uint64_t words[MAX_PARAMS];
    CUtensorMap maps[MAX_MAPS] __attribute__((aligned(64)));
    int n_maps = 0;
    if (trace != NULL) {
      EMIT(gx); EMIT(gy); EMIT(gz); EMIT(threads); EMIT(shared); EMIT(flags); EMIT(n_params);
    }
    for (int64_t p = 0; p < n_params; p++) {
      int64_t pkind = NEXT();
      if (pkind == 0 || pkind == 3) {
        int64_t buffer = NEXT(), offset = NEXT();
        if (buffer < 0 || buffer >= n) return bad(message, size, "plan: buffer index out of range");
        uint64_t address = ptrs[buffer] + (uint64_t)offset;
        if (pkind == 0) {
          words[p] = address;
          params[p] = &words[p];
          if (trace != NULL) EMIT(address);
          continue;
        }
        int64_t dtype = NEXT(), rank = NEXT(), swizzle = NEXT(), fill = NEXT();
        if (rank < 1 || rank > 5 || n_maps >= MAX_MAPS) return bad(message, size, "plan: bad tensor map");
        cuuint64_t dims[5], strides[5] = {0};
        cuuint32_t box[5], unit[5] = {1, 1, 1, 1, 1};
        for (int64_t j = 0; j < rank; j++) dims[j] = (cuuint64_t)NEXT();
        for (int64_t j = 0; j < rank - 1; j++) strides[j] = (cuuint64_t)NEXT();
        for (int64_t j = 0; j < rank; j++) box[j] = (cuuint32_t)NEXT();
        if (at > length) break;
        if (trace != NULL) {
          EMIT(-3); EMIT(address); EMIT(dtype); EMIT(rank); EMIT(swizzle); EMIT(fill);
          for (int64_t j = 0; j < rank; j++) EMIT(dims[j]);
          for (int64_t j = 0; j < rank - 1; j++) EMIT(strides[j]);
          for (int64_t j = 0; j < rank; j++) EMIT(box[j]);
          memset(&maps[n_maps], 0, sizeof(CUtensorMap));
        } else if (encode(&maps[n_maps], (CUtensorMapDataType)dtype, (cuuint32_t)rank, (void*)(uintptr_t)address,
                          dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, (CUtensorMapSwizzle)swizzle,
                          CU_TENSOR_MAP_L2_PROMOTION_L2_128B, (CUtensorMapFloatOOBfill)fill) != CUDA_SUCCESS) {
          return bad(message, size, "cuTensorMapEncodeTiled failed");
        }
        params[p] = &maps[n_maps++];
      } else if (pkind == 1) {
        int64_t bytes = NEXT(), value = NEXT();
        if (bytes != 1 && bytes != 2 && bytes != 4 && bytes != 8) return bad(message, size, "plan: bad scalar");
        words[p] = 0;
        memcpy(&words[p], &value, (size_t)bytes);  // little endian: the low bytes
        params[p] = &words[p];
        if (trace != NULL) EMIT(value);
      } else if (pkind == 2) {
        words[p] = 0;
        params[p] = &words[p];
        if (trace != NULL) EMIT(0);
      } else {
        return bad(message, size, "plan: unknown parameter kind");
      }
    }
    if (at > length) return bad(message, size, "plan: truncated program");
    if (trace != NULL) continue;
    CUlaunchAttribute attrs[2];
    unsigned n_attrs = 0;
    if (flags & 1) {
      attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attrs[n_attrs++].value.programmaticStreamSerializationAllowed = 1;
    }
    if (flags & 2) {
      attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
      attrs[n_attrs++].value.cooperative = 1;
    }
    CUlaunchConfig config;
    memset(&config, 0, sizeof(config));
    config.gridDimX = gx; config.gridDimY = gy; config.gridDimZ = gz;
    config.blockDimX = threads; config.blockDimY = 1; config.blockDimZ = 1;
    config.sharedMemBytes = shared;
    config.hStream = (CUstream)stream;
    config.attrs = attrs;
    config.numAttrs = n_attrs;
    if (launch(&config, function, params, NULL) != CUDA_SUCCESS) return bad(message, size, "cuLaunchKernelEx failed");
  }
  if (at > length) return bad(message, size, "plan: truncated program");
  if (traced != NULL) *traced = written;
  return NULL;
#undef NEXT
#undef EMIT
}

// The replay as ragdot's eager calls make it: no trace, the message in a per-thread buffer. NULL on success.
const char* ragdot_replay_run(const int64_t* program, int64_t length, const uint64_t* ptrs, int64_t n,
                              uint64_t stream) {
  static __thread char message[256];
  return ragdot_replay(program, length, ptrs, n, stream, NULL, 0, NULL, message, sizeof(message));
}
