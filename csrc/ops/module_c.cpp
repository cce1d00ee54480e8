// `import fast_ulysses._C` loads this library; its TORCH_LIBRARY blocks register the ops.
#include <Python.h>

static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "fast-ulysses ops (plan, Meta)", -1,
                             nullptr, nullptr, nullptr, nullptr, nullptr};
PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
