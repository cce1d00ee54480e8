// The collectives' Autograd kernels, in C++, so that a call runs no Python on its way to the
// transport whether it records a backward or not: UlyssesGroup's typed entry (fast_entry.cpp)
// serves every eager call, and torch.ops callers and torch.compile reach the same kernels
// (docs/DESIGN.md, "One route per call").
//
// The owned op (all_to_all_single_4d): the all-to-all is a permutation of elements, so its
// gradient is the inverse permutation, the call in mode 1 - m with the same splits and layout,
// on backward_tag(tag) (plan/tag_rules.h: its own window, so the backward never touches a
// forward window that may still be in use). Gradients are therefore bit-exact. The backward
// calls the op through the dispatcher, its Autograd kernel included, so a double backward
// works and torch.compile traces the backward as the op. With FAST_ULYSSES_DEBUG=1 the backward
// first hands its call to the hook Python set (`set_backward_check`), which checks it across
// ranks through the debugged group.
//
// The borrowed op: applies the borrowed rule (check_borrowed_grad) and records no backward. The
// out= op has none: UlyssesGroup refuses out= with an input that requires grad.
#include "ops/autograd_kernels.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <pybind11/pybind11.h>
#include <torch/autograd.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include "ops/call_args.h"
#include "ops/op_handles.h"
#include "ops/plan_ops.h"
#include "plan/tag_rules.h"

namespace fast_ulysses::ops {
namespace {

using Splits = std::optional<std::vector<int64_t>>;

// The debug hook: a Python callable (a strong reference), or null. Set and cleared with the GIL
// held; the backward reads it once without the GIL to skip the GIL when none is set.
std::atomic<PyObject*> backward_check{nullptr};

c10::IValue saved(const std::optional<at::IntArrayRef>& splits) {
  return splits ? c10::IValue(splits->vec()) : c10::IValue();
}

Splits splits_of(const c10::IValue& value) {
  return value.isNone() ? Splits() : Splits(value.toIntVector());
}

std::optional<at::IntArrayRef> view(const Splits& splits) {
  return splits ? std::optional<at::IntArrayRef>(*splits) : std::nullopt;
}

PyObject* text(const std::string& value) {
  return PyUnicode_FromStringAndSize(value.data(), static_cast<Py_ssize_t>(value.size()));
}

PyObject* to_python(const Splits& splits) {
  if (!splits) Py_RETURN_NONE;
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(splits->size()));
  for (size_t i = 0; list != nullptr && i < splits->size(); ++i) {
    PyObject* value = PyLong_FromLongLong((*splits)[i]);
    if (value == nullptr) {
      Py_CLEAR(list);
      break;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), value);
  }
  return list;
}

// Hands the backward's call to the debug hook, if one is set: hook(group_name, grad, mode, tag,
// seq_splits, head_splits, layout). Its exception (the ranks disagree) ends the backward as it
// is, before anything is sent.
void check_backward(const std::string& group_name, const at::Tensor& grad, int64_t mode,
                    const std::string& tag, const Splits& seq_splits, const Splits& head_splits,
                    const std::string& layout) {
  if (backward_check.load(std::memory_order_acquire) == nullptr) return;
  pybind11::gil_scoped_acquire gil;
  PyObject* hook = backward_check.load(std::memory_order_acquire);
  if (hook == nullptr) return;
  Py_INCREF(hook);
  PyObject* args[] = {text(group_name), THPVariable_Wrap(grad), PyLong_FromLongLong(mode),
                      text(tag),        to_python(seq_splits),  to_python(head_splits),
                      text(layout)};
  constexpr size_t kCount = sizeof(args) / sizeof(args[0]);
  bool made = true;
  for (PyObject* arg : args) made = made && arg != nullptr;
  PyObject* result = made ? PyObject_Vectorcall(hook, args, kCount, nullptr) : nullptr;
  for (PyObject* arg : args) Py_XDECREF(arg);
  Py_DECREF(hook);
  if (result == nullptr) {  // the Python exception, carried across the autograd engine's threads
    python_error error;
    error.persist();
    throw error;
  }
  Py_DECREF(result);
}

class OwnedAllToAll : public torch::autograd::Function<OwnedAllToAll> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx,
                            const at::Tensor& x FU_OWNED_ARGS(FU_PARAM)) {
    auto& call = ctx->saved_data;
    call["mode"] = mode;
    call["tag"] = tag;
    call["group_name"] = group_name;
    call["seq_splits"] = saved(seq_splits);
    call["head_splits"] = saved(head_splits);
    call["layout"] = layout;
    call["rank"] = rank;
    at::AutoDispatchBelowADInplaceOrView below;
    return owned_op().call(x FU_OWNED_ARGS(FU_ARG));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto& call = ctx->saved_data;
    const int64_t mode = 1 - call.at("mode").toInt();
    const std::string tag = backward_tag(call.at("tag").toStringRef());
    const std::string group_name = call.at("group_name").toStringRef();
    const Splits seq_splits = splits_of(call.at("seq_splits"));
    const Splits head_splits = splits_of(call.at("head_splits"));
    const std::string layout = call.at("layout").toStringRef();
    const at::Tensor grad = grads[0].contiguous();  // (the gradient of a sum is expanded)
    check_backward(group_name, grad, mode, tag, seq_splits, head_splits, layout);
    torch::autograd::variable_list result(1 FU_OWNED_ARGS(FU_COUNT));  // x's, then none
    result[0] = owned_op().call(grad, mode, tag, group_name, view(seq_splits), view(head_splits),
                                layout, call.at("rank").toOptional<int64_t>());
    return result;
  }
};

at::Tensor owned_autograd(const at::Tensor& x FU_OWNED_ARGS(FU_PARAM)) {
  return OwnedAllToAll::apply(x FU_OWNED_ARGS(FU_ARG));
}

void borrowed_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                       torch::jit::Stack* stack) {
  const size_t arguments = op.schema().arguments().size();
  const c10::IValue& x = (*stack)[stack->size() - arguments];
  if (x.isTensor()) check_borrowed_grad(x.toTensor(), "all_to_all_single_4d_borrowed");
  at::AutoDispatchBelowAutograd guard;
  op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
}

}  // namespace

void set_backward_check(PyObject* hook) {
  if (hook == Py_None) hook = nullptr;
  Py_XINCREF(hook);
  Py_XDECREF(backward_check.exchange(hook, std::memory_order_acq_rel));
}

}  // namespace fast_ulysses::ops

TORCH_LIBRARY_IMPL(fast_ulysses, Autograd, m) {
  m.impl("all_to_all_single_4d", &fast_ulysses::ops::owned_autograd);
  m.impl("all_to_all_single_4d_borrowed",
         torch::CppFunction::makeFromBoxedFunction<&fast_ulysses::ops::borrowed_autograd>());
}
