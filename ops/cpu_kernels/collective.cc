// spmd_allreduce: an in-graph MPI_Allreduce (sum over MPI_COMM_WORLD) as a Paddle CPU custom op.
//
// Paddle's own in-graph collective on CPU goes through gloo and costs ~2 ms a call under mpirun
// (DESIGN §4); this op calls the MPI library mpi4py already initialised in the process (~10-20 us
// for a [T, H] fp32 tensor between two ranks), so a tensor-parallel rank's whole step can be one
// graph.  Every rank must run the same graphs in the same order: the runner guarantees it (the
// choice of graph depends only on the broadcast StepPlan).
#include <dlfcn.h>
#include <mpi.h>

#include <chrono>
#include <vector>

#include "paddle/extension.h"
#include "tensor_pool.h"

namespace {
double g_seconds = 0.0;  // wall time spent inside MPI_Allreduce (waiting for the slowest rank included)
long g_calls = 0;

// Releases Python's GIL for the duration of a wait, if this thread holds it.  paddle.inference's
// `run` keeps the GIL for the whole graph and runs the ops on the calling thread (checked), so
// without this rank 0's IO thread (HTTP, gRPC, PeerWatch noticing a dead rank) would freeze for
// as long as the other ranks make this rank wait, e.g. forever once a peer died.  The C API is
// looked up at run time: the library is built without Python's headers and loads in any process.
class GilRelease {
 public:
  GilRelease() {
    static const auto initialized = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "Py_IsInitialized"));
    static const auto holds = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "PyGILState_Check"));
    static const auto save = reinterpret_cast<void* (*)()>(dlsym(RTLD_DEFAULT, "PyEval_SaveThread"));
    if (initialized && holds && save && restore() && initialized() && holds()) state_ = save();
  }
  ~GilRelease() {
    if (state_ != nullptr) restore()(state_);
  }
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  static void (*restore())(void*) {
    static const auto fn = reinterpret_cast<void (*)(void*)>(dlsym(RTLD_DEFAULT, "PyEval_RestoreThread"));
    return fn;
  }
  void* state_ = nullptr;  // the PyThreadState* to restore
};
}  // namespace

// Read by ops/paddle_ext.py through ctypes: the per-step "allreduce" share of execute time.
extern "C" double spmd_allreduce_seconds() { return g_seconds; }
extern "C" long spmd_allreduce_calls() { return g_calls; }

std::vector<paddle::Tensor> AllReduceForward(const paddle::Tensor& x) {
  PD_CHECK(x.dtype() == paddle::DataType::FLOAT32, "spmd_allreduce: float32 only");
  PD_CHECK(x.numel() <= 0x7fffffff, "spmd_allreduce: tensor too large for one MPI call");
  auto out = spmd::new_tensor(x.shape(), x.dtype());
  auto t0 = std::chrono::steady_clock::now();
  int rc;
  {
    GilRelease nogil;
    rc = MPI_Allreduce(x.data<float>(), out.data<float>(), static_cast<int>(x.numel()), MPI_FLOAT, MPI_SUM,
                       MPI_COMM_WORLD);
  }
  g_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++g_calls;
  PD_CHECK(rc == MPI_SUCCESS, "spmd_allreduce: MPI_Allreduce failed");
  return {out};
}

std::vector<std::vector<int64_t>> AllReduceShape(const std::vector<int64_t>& x) { return {x}; }
std::vector<paddle::DataType> AllReduceDtype(const paddle::DataType& x) { return {x}; }

PD_BUILD_OP(spmd_allreduce)
    .Inputs({"X"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(AllReduceForward))
    .SetInferShapeFn(PD_INFER_SHAPE(AllReduceShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(AllReduceDtype));
