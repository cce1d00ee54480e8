// Typed dispatcher handles of the three collectives, for C++ that calls them through the
// dispatcher: the typed entry (fast_entry.cpp) and the owned op's backward (autograd_kernels.cpp).
// Their signatures are the kernels' (call_args.h). Each library that includes this finds the
// schema once, on its first call.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string>

#include "ops/call_args.h"

namespace fast_ulysses::ops {

using OwnedSignature = at::Tensor(const at::Tensor& FU_OWNED_ARGS(FU_TYPE));
using BorrowedSignature = at::Tensor(const at::Tensor& FU_BORROWED_ARGS(FU_TYPE));
using OutSignature = at::Tensor&(const at::Tensor& FU_OWNED_ARGS(FU_TYPE), at::Tensor&);

inline const c10::TypedOperatorHandle<OwnedSignature>& owned_op() {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("fast_ulysses::all_to_all_single_4d", "")
                                 .typed<OwnedSignature>();
  return handle;
}

inline const c10::TypedOperatorHandle<BorrowedSignature>& borrowed_op() {
  static const auto handle =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("fast_ulysses::all_to_all_single_4d_borrowed", "")
          .typed<BorrowedSignature>();
  return handle;
}

inline const c10::TypedOperatorHandle<OutSignature>& out_op() {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("fast_ulysses::all_to_all_single_4d_out", "")
                                 .typed<OutSignature>();
  return handle;
}

}  // namespace fast_ulysses::ops
