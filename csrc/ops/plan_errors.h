// PlanError (csrc/plan: no torch) as the c10::ValueError Python sees as ValueError, with the
// plan's message unchanged. Header-only (c10 alone), so the transport uses it too.
#pragma once

#include <c10/util/Exception.h>

#include "plan/plan.h"

namespace fast_ulysses {

template <typename Fn>
auto translate_plan_errors(Fn&& fn) {
  try {
    return fn();
  } catch (const PlanError& error) {
    TORCH_CHECK_VALUE(false, error.what());
  }
}

}  // namespace fast_ulysses
