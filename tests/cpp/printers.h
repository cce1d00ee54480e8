// gtest printers for the plan's enums, so parameterized test names read "(0, bshd)" and not
// "4-byte object <00-00 00-00>". They live in fast_ulysses for argument-dependent lookup.
#pragma once

#include <ostream>

#include "plan/plan.h"

namespace fast_ulysses {

inline void PrintTo(Mode mode, std::ostream* out) {
  *out << "mode" << static_cast<int>(mode);
}
inline void PrintTo(Layout layout, std::ostream* out) {
  *out << layout_name(layout);
}

}  // namespace fast_ulysses
