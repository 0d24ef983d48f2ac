// An XLA FFI handler that does nothing: three operand buffers in, one result buffer out (ragged_dot's
// signature). benchmarks/jax_host_profile.py builds it (a C++17 compiler, jax.ffi.include_dir()'s headers)
// and times it beside an empty buffer_callback: the host cost per call of a custom call with no Python in it,
// the floor of an FFI-based ragdot.jax (docs/jax.md, "An XLA FFI handler").
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

static ffi::Error Nothing(ffi::AnyBuffer, ffi::AnyBuffer, ffi::AnyBuffer, ffi::Result<ffi::AnyBuffer>) {
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(RagdotEmptyCall, Nothing,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
