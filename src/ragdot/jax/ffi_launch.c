// ragdot.jax's XLA FFI handler: replays a recorded launch plan on XLA's stream, or asks Python.
//
// One custom call target ("ragdot_launch") serves every ragdot.jax call. The call's `slot` attribute (int64:
// this process's token in the high 32 bits, the slot's index in the low 32) names what it computes. On a
// CUDA device the handler looks up the slot's plan for the call's device: a program of kernel launches and
// zero fills over the call's buffers (operands first, then results), recorded from ragdot's own prepared call
// on its first run (ragdot/native/plan.py writes the program; ragdot/native/replay.c, included here, replays
// it and documents its layout). With a plan, a call is C alone on XLA's stream. Without one (the
// first call, a backend that is not a recorded Triton kernel, the host platform), the handler calls the
// resolver Python registered, which runs ragdot's PyTorch code on the buffers and may install a plan.
//
// Buffers: operand i is buffer i, result j is buffer n_operands + j.

#include <pthread.h>
#include <stdlib.h>

#include "../native/replay.c"
#include "xla/ffi/api/c_api.h"

#define MAX_BUFFERS 32
#define MAX_DEVICES 16

typedef int (*resolver_fn)(int64_t slot, int64_t device, uint64_t stream, int64_t n, const uint64_t* ptrs,
                           char* message, int64_t size);

typedef struct {
  int64_t* program[MAX_DEVICES];  // per device ordinal; NULL: none (ask the resolver)
  int64_t length[MAX_DEVICES];
} Slot;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static Slot* slots = NULL;
static int64_t n_slots = 0;
static uint32_t token = 0;
static resolver_fn resolver = NULL;
// Interpreter exit (ragdot_ffi_close, from an atexit hook): a thread that enters Python while the interpreter
// finalizes is ended by it mid-call, through XLA's frames, which aborts the process. So after close no call
// enters the resolver (it fails instead; its results are never read), and the hook waits for the calls already
// inside it (in_flight).
static int closing = 0;
static int64_t in_flight = 0;

void ragdot_ffi_close(void) { __atomic_store_n(&closing, 1, __ATOMIC_SEQ_CST); }
int64_t ragdot_ffi_in_flight(void) { return __atomic_load_n(&in_flight, __ATOMIC_SEQ_CST); }

// ---- set from Python (ctypes) ----------------------------------------------------------------------------
void ragdot_ffi_init(uint32_t process_token, resolver_fn fn) {
  pthread_mutex_lock(&lock);
  token = process_token;
  resolver = fn;
  pthread_mutex_unlock(&lock);
}

// Install (or with length 0 remove) the plan of one slot on one device; 0 on success.
int ragdot_ffi_set_plan(int64_t slot, int64_t device, const int64_t* program, int64_t length) {
  if (slot < 0 || device < 0 || device >= MAX_DEVICES || length < 0) return -1;
  int64_t* copy = NULL;
  if (length > 0) {
    copy = (int64_t*)malloc(sizeof(int64_t) * (size_t)length);
    if (copy == NULL) return -2;
    memcpy(copy, program, sizeof(int64_t) * (size_t)length);
  }
  pthread_mutex_lock(&lock);
  if (slot >= n_slots) {
    int64_t grown = slot + 64;
    Slot* more = (Slot*)realloc(slots, sizeof(Slot) * (size_t)grown);
    if (more == NULL) {
      pthread_mutex_unlock(&lock);
      free(copy);
      return -2;
    }
    memset(more + n_slots, 0, sizeof(Slot) * (size_t)(grown - n_slots));
    slots = more;
    n_slots = grown;
  }
  // A replaced program is leaked on purpose: another thread may be replaying it right now.
  slots[slot].program[device] = copy;
  slots[slot].length[device] = length;
  pthread_mutex_unlock(&lock);
  return 0;
}

// Drop every plan (ragdot.jax.clear_plans): later calls ask the resolver again. Programs are leaked, as above.
void ragdot_ffi_clear(void) {
  pthread_mutex_lock(&lock);
  if (slots != NULL) memset(slots, 0, sizeof(Slot) * (size_t)n_slots);
  pthread_mutex_unlock(&lock);
}

// ---- the handlers ----------------------------------------------------------------------------------------
static XLA_FFI_Error* fail(const XLA_FFI_Api* api, XLA_FFI_Error_Code code, const char* message) {
  XLA_FFI_Error_Create_Args args;
  memset(&args, 0, sizeof(args));
  args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  args.message = message;
  args.errc = code;
  return api->XLA_FFI_Error_Create(&args);
}

static int metadata(XLA_FFI_CallFrame* frame) {
  if (frame->extension_start == NULL || frame->extension_start->type != XLA_FFI_Extension_Metadata) return 0;
  XLA_FFI_Metadata* meta = ((XLA_FFI_Metadata_Extension*)frame->extension_start)->metadata;
  XLA_FFI_Api_Version version = {XLA_FFI_Api_Version_STRUCT_SIZE, NULL, XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR};
  meta->api_version = version;
  meta->traits = 0;  // not command-buffer compatible: the resolver is Python
  return 1;
}

// The slot attribute (int64), checked against this process's token; the slot's index, or -1.
static int64_t slot_of(XLA_FFI_CallFrame* frame, const char** why) {
  for (int64_t i = 0; i < frame->attrs.size; i++) {
    XLA_FFI_ByteSpan* name = frame->attrs.names[i];
    if (name->len != 4 || memcmp(name->ptr, "slot", 4) != 0) continue;
    if (frame->attrs.types[i] != XLA_FFI_AttrType_SCALAR) break;
    XLA_FFI_Scalar* scalar = (XLA_FFI_Scalar*)frame->attrs.attrs[i];
    if (scalar->dtype != XLA_FFI_DataType_S64) break;
    uint64_t value = (uint64_t)*(int64_t*)scalar->value;
    if ((uint32_t)(value >> 32) != token) {
      *why = "ragdot.jax: this program was compiled in another process (its launch slot is not this process's); "
             "trace it again here";
      return -1;
    }
    return (int64_t)(value & 0xffffffffu);
  }
  *why = "ragdot.jax: the custom call has no int64 'slot' attribute";
  return -1;
}

static XLA_FFI_Error* handle(XLA_FFI_CallFrame* frame, int cuda) {
  if (metadata(frame)) return NULL;
  if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE) return NULL;
  const XLA_FFI_Api* api = frame->api;
  const char* why = NULL;
  int64_t slot = slot_of(frame, &why);
  if (slot < 0) return fail(api, XLA_FFI_Error_Code_FAILED_PRECONDITION, why);
  int64_t n = frame->args.size + frame->rets.size;
  if (n > MAX_BUFFERS) return fail(api, XLA_FFI_Error_Code_INVALID_ARGUMENT, "ragdot.jax: too many buffers");
  uint64_t ptrs[MAX_BUFFERS];
  for (int64_t i = 0; i < frame->args.size; i++) ptrs[i] = (uint64_t)(uintptr_t)((XLA_FFI_Buffer*)frame->args.args[i])->data;
  for (int64_t i = 0; i < frame->rets.size; i++)
    ptrs[frame->args.size + i] = (uint64_t)(uintptr_t)((XLA_FFI_Buffer*)frame->rets.rets[i])->data;
  uint64_t stream = 0;
  int64_t device = -1;
  const int64_t* program = NULL;
  int64_t length = 0;
  if (cuda) {
    XLA_FFI_Stream_Get_Args sargs = {XLA_FFI_Stream_Get_Args_STRUCT_SIZE, NULL, frame->ctx, NULL};
    XLA_FFI_Error* error = api->XLA_FFI_Stream_Get(&sargs);
    if (error != NULL) return error;
    stream = (uint64_t)(uintptr_t)sargs.stream;
    // An XLA without the device-ordinal query (older than this header): -2, the resolver's "current device",
    // and no plans (a plan is per device).
    device = -2;
    if (api->struct_size >= offsetof(XLA_FFI_Api, XLA_FFI_DeviceOrdinal_Get) + sizeof(void*) &&
        api->XLA_FFI_DeviceOrdinal_Get != NULL) {
      XLA_FFI_DeviceOrdinal_Get_Args dargs = {XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE, NULL, frame->ctx, 0};
      error = api->XLA_FFI_DeviceOrdinal_Get(&dargs);
      if (error != NULL) return error;
      device = dargs.device_ordinal;
    }
    if (device >= 0 && device < MAX_DEVICES) {
      pthread_mutex_lock(&lock);
      if (slot < n_slots) {
        program = slots[slot].program[device];
        length = slots[slot].length[device];
      }
      pthread_mutex_unlock(&lock);
    }
  }
  char message[512];
  message[0] = 0;
  if (program != NULL) {
    const char* error = ragdot_replay(program, length, ptrs, n, stream, NULL, 0, NULL, message, sizeof(message));
    return error == NULL ? NULL : fail(api, XLA_FFI_Error_Code_INTERNAL, error);
  }
  if (resolver == NULL) return fail(api, XLA_FFI_Error_Code_FAILED_PRECONDITION, "ragdot.jax: no resolver set");
  __atomic_add_fetch(&in_flight, 1, __ATOMIC_SEQ_CST);  // before reading closing: the hook waits for it
  if (__atomic_load_n(&closing, __ATOMIC_SEQ_CST)) {
    __atomic_sub_fetch(&in_flight, 1, __ATOMIC_SEQ_CST);
    return fail(api, XLA_FFI_Error_Code_CANCELLED, "ragdot.jax: the Python interpreter is exiting");
  }
  int failed = resolver(slot, device, stream, n, ptrs, message, sizeof(message));
  __atomic_sub_fetch(&in_flight, 1, __ATOMIC_SEQ_CST);
  if (failed) return fail(api, XLA_FFI_Error_Code_INTERNAL, message[0] ? message : "ragdot.jax: the call failed");
  return NULL;
}

XLA_FFI_Error* ragdot_ffi_cuda(XLA_FFI_CallFrame* frame) { return handle(frame, 1); }
XLA_FFI_Error* ragdot_ffi_host(XLA_FFI_CallFrame* frame) { return handle(frame, 0); }
