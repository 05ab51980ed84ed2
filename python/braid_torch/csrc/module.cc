// The Python module braid_torch._C: the process group class and its creator for
// torch.distributed.Backend.register_backend (python/braid_torch/__init__.py registers it).
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>  // c10::intrusive_ptr as a pybind11 holder

#include "process_group.h"
#include "tensors.h"  // BRAID_TORCH_CUDA

namespace py = pybind11;
using braid::torch_backend::ProcessGroupBraid;

PYBIND11_MODULE(_C, m) {
  m.doc() = "Braid as a torch.distributed backend (import braid_torch; init_process_group(\"braid\"))";
  // c10d's classes are registered with pybind11 when torch.distributed is imported.
  py::module::import("torch.distributed");
  py::class_<ProcessGroupBraid, braid::torch_backend::Base, c10::intrusive_ptr<ProcessGroupBraid>>(m, "ProcessGroupBraid")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout) {
             return c10::make_intrusive<ProcessGroupBraid>(store, rank, size, timeout);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>())
      .def("_batch_isend_irecv", &ProcessGroupBraid::batchSendRecv, py::arg("ops"), py::call_guard<py::gil_scoped_release>(),
           "[(is_send, tensor, group rank, tag)] as one Braid group; one Work per operation")
      .def("_cpp_all_reduce", &ProcessGroupBraid::cppAllReduce, py::arg("tensor"), py::call_guard<py::gil_scoped_release>(),
           "Sum all-reduce of a dense CPU tensor in place through Braid's C++ API, waited on (for benchmarks)")
      .def("_status_record", &ProcessGroupBraid::statusRecord, "This rank's live record as JSON (braid_torch.status)")
      .def("_unique_id", &ProcessGroupBraid::uniqueId, "host:port/nonce of the group's rendezvous (braid status --unique-id)");
  m.def("_finish_all_queued", &ProcessGroupBraid::finishAllQueued, py::call_guard<py::gil_scoped_release>(),
        "Runs what every Braid process group of this process still has queued (braid_torch: at exit)");
  m.attr("cuda") = py::bool_(BRAID_TORCH_CUDA != 0);  // CUDA tensors too (python/meson.build says when)
  m.def("create", &ProcessGroupBraid::create, py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
        py::call_guard<py::gil_scoped_release>(),
        "The creator torch.distributed.Backend.register_backend calls: (store, rank, size, timeout) -> process group");
}
