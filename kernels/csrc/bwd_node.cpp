// The eager backward of kernels.attention as a C++ autograd node (kernels/sm90/cpp_backward.py builds and loads it).
//
// Why: for CUDA tensors autograd runs every backward node on its device thread. A Python node (the
// torch.autograd.Function of kernels/ops.py) makes that thread take the GIL and run our Python launcher there; on the
// H200 that cost our fwd + bwd of a tiny problem 143-149 us per call against cuDNN's C++ node's 88-115 us (README,
// "Host time per call"). This node does the same work as kernels/sm90/backward.py backward_trusted without Python:
// the scratch buffers, then the three compiled kernels (preprocess, main, postprocess) called through TVM FFI's C
// ABI on the current stream. Which kernels and how many rows of scratch come from a plan registered once per compile
// key by the Python side (register_plan); the calls' argument lists are backward_trusted's, kept in step by
// tests/test_cpp_backward.py (CPU: the calls recorded by a fake TVM FFI) and the GPU test comparing both paths bit
// for bit. The TVM FFI entry points come in as addresses (set_api: libtvm_ffi's, or the fakes below), so the module
// links nothing but torch.
#include <torch/extension.h>

#include <ATen/dlpack.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

namespace {

// TVMFFIAny (tvm/ffi/c_api.h): one argument in TVM FFI's C calling convention
struct FFIAny {
  int32_t type_index;
  uint32_t zero_padding;
  union {
    int64_t v_int64;
    double v_float64;
    void* v_ptr;
  };
};
static_assert(sizeof(FFIAny) == 16, "TVMFFIAny is 16 bytes");
constexpr int32_t kFFINone = 0, kFFIInt = 1, kFFIFloat = 3, kFFIDLTensorPtr = 7, kFFIStaticObjectBegin = 64;

// TVMFFIFunctionCall, TVMFFIEnvSetStream, TVMFFIErrorMoveFromRaised, TVMFFIObjectDecRef
using CallFn = int (*)(void* func, FFIAny* args, int32_t num_args, FFIAny* result);
using SetStreamFn = int (*)(int32_t device_type, int32_t device_id, void* stream, void** original);
using MoveErrorFn = void (*)(void** error);
using DecRefFn = int (*)(void* object);

struct Api {
  CallFn call = nullptr;
  SetStreamFn set_stream = nullptr;
  MoveErrorFn move_error = nullptr;
  DecRefFn dec_ref = nullptr;
};
Api g_api;

// One compiled backward (a compile key of backward.py): its three TVM FFI functions and the sizes of its scratch.
struct Plan {
  void* pre;
  void* main;
  void* post;
  int64_t tile_m, q_pad_rows, sem_rows, sem_mult, tile_n, ctas;  // ctas: the persistent grid's SM count, 0: one-tile
  bool zero_sem, stream_pre, stream_post;
};
std::mutex g_mu;
std::vector<std::unique_ptr<Plan>> g_plans;  // registered once per key, never freed: ids stay valid

const Plan& plan_at(int64_t id) {
  std::lock_guard<std::mutex> lock(g_mu);
  TORCH_CHECK(id >= 0 && id < static_cast<int64_t>(g_plans.size()), "fa4lab backward node: unknown plan ", id);
  return *g_plans[id];
}

DLDataType dl_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBFloat16: return DLDataType{static_cast<uint8_t>(kDLBfloat), 16, 1};
    case at::kHalf: return DLDataType{static_cast<uint8_t>(kDLFloat), 16, 1};
    case at::kFloat: return DLDataType{static_cast<uint8_t>(kDLFloat), 32, 1};
    case at::kInt: return DLDataType{static_cast<uint8_t>(kDLInt), 32, 1};
    default: TORCH_CHECK(false, "fa4lab backward node: no DLPack dtype for ", t.scalar_type());
  }
}

// The arguments of one call: DLTensor views of torch tensors (alive for the call) and scalars.
class Args {
 public:
  explicit Args(size_t n) { dl_.reserve(n); any_.reserve(n); }  // reserved: the DLTensor addresses stay put
  Args& tensor(const at::Tensor& t) {
    TORCH_CHECK(dl_.size() < dl_.capacity(), "fa4lab backward node: more arguments than reserved");
    DLTensor d{};
    d.data = t.data_ptr();
    d.device = DLDevice{t.is_cuda() ? kDLCUDA : kDLCPU, t.is_cuda() ? static_cast<int32_t>(t.get_device()) : 0};
    d.ndim = static_cast<int32_t>(t.dim());
    d.dtype = dl_dtype(t);
    d.shape = const_cast<int64_t*>(t.sizes().data());
    d.strides = const_cast<int64_t*>(t.strides().data());
    d.byte_offset = 0;
    dl_.push_back(d);
    FFIAny a{};
    a.type_index = kFFIDLTensorPtr;
    a.v_ptr = &dl_.back();
    any_.push_back(a);
    return *this;
  }
  Args& integer(int64_t v) {
    FFIAny a{};
    a.v_int64 = v;
    return scalar(kFFIInt, a);
  }
  Args& real(double v) {
    FFIAny a{};
    a.v_float64 = v;
    return scalar(kFFIFloat, a);
  }
  void call(void* fn, const char* what) {
    FFIAny result{};
    result.type_index = kFFINone;
    int rc = g_api.call(fn, any_.data(), static_cast<int32_t>(any_.size()), &result);
    if (rc != 0) {
      void* err = nullptr;
      if (g_api.move_error != nullptr) g_api.move_error(&err);  // take the raised error off this thread
      if (err != nullptr && g_api.dec_ref != nullptr) g_api.dec_ref(err);
      TORCH_CHECK(false, "fa4lab backward node: the ", what, " kernel call failed (TVM FFI returned ", rc,
                  "); FA4LAB_CPP_BWD=0 runs the Python node, whose error names the cause");
    }
    if (result.type_index >= kFFIStaticObjectBegin && result.v_ptr != nullptr && g_api.dec_ref != nullptr) {
      g_api.dec_ref(result.v_ptr);
    }
  }

 private:
  Args& scalar(int32_t type_index, FFIAny a) {
    a.type_index = type_index;
    any_.push_back(a);
    return *this;
  }
  std::vector<DLTensor> dl_;
  std::vector<FFIAny> any_;
};

// The current stream of the tensors' device as TVM FFI's environment stream while the kernels are called.
class EnvStream {
 public:
  explicit EnvStream(const at::Tensor& t) {
    if (!t.is_cuda()) return;
    device_ = static_cast<int32_t>(t.get_device());
    void* stream = c10::impl::getDeviceGuardImpl(t.device().type())->getStream(t.device()).native_handle();
    TORCH_CHECK(g_api.set_stream(kDLCUDA, device_, stream, &previous_) == 0,
                "fa4lab backward node: TVMFFIEnvSetStream failed");
    set_ = true;
  }
  ~EnvStream() {
    if (set_) g_api.set_stream(kDLCUDA, device_, previous_, nullptr);
  }

 private:
  bool set_ = false;
  int32_t device_ = 0;
  void* previous_ = nullptr;
};

std::vector<at::Tensor> run_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& out, const at::Tensor& dout_in, const at::Tensor& lse,
                                     int64_t plan_id, double scale) {
  TORCH_CHECK(g_api.call != nullptr && g_api.set_stream != nullptr, "fa4lab backward node: set_api was not called");
  const Plan& p = plan_at(plan_id);
  at::Tensor dout = dout_in.contiguous();
  c10::DeviceGuard guard(q.device());
  const int64_t b = q.size(0), sq = q.size(1), h = q.size(2), d = q.size(3), sk = k.size(1), h_kv = k.size(2);
  const int64_t group = h / h_kv, d_v = v.size(3);
  const int64_t sqp = (sq + p.tile_m - 1) / p.tile_m * p.tile_m + p.q_pad_rows;
  const int64_t n_m = sqp / p.sem_rows * p.sem_mult;
  auto f32 = q.options().dtype(at::kFloat);
  auto i32 = q.options().dtype(at::kInt);
  at::Tensor lse2 = at::empty({b, h, sqp}, f32);
  at::Tensor dpsum = at::empty({b, h, sqp}, f32);
  at::Tensor dqacc = at::empty({b, h, sqp, d}, f32);
  at::Tensor sem = p.zero_sem ? at::zeros({b, h, n_m}, i32) : at::empty({b, h, n_m}, i32);
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  // GQA: the main kernel writes dK / dV per Q head into scratch, summed over each group after it
  at::Tensor dk_h = group == 1 ? dk : at::empty({b, sk, h, d}, k.options());
  at::Tensor dv_h = group == 1 ? dv : at::empty({b, sk, h, d_v}, v.options());
  EnvStream env(q);
  {
    Args a(7);
    a.tensor(out).tensor(dout).tensor(lse).tensor(dpsum).tensor(lse2).tensor(dqacc);
    if (p.stream_pre) a.tensor(sem);
    a.call(p.pre, "preprocess");
  }
  {
    Args a(10);
    a.tensor(q).tensor(k).tensor(v).tensor(dout).tensor(lse2).tensor(dpsum).tensor(dqacc).tensor(dk_h).tensor(dv_h);
    a.tensor(sem).real(scale);
    if (p.ctas > 0) {  // the persistent main kernel: one CTA per SM at most
      const int64_t tiles = (sk + p.tile_n - 1) / p.tile_n * h * b;
      a.integer(std::min(p.ctas, tiles));
    }
    a.call(p.main, "main");
  }
  {
    Args a(3);
    a.tensor(dqacc).tensor(dq);
    if (p.stream_post) a.tensor(sem).integer(sk);
    a.real(scale);
    a.call(p.post, "postprocess");
  }
  if (group > 1) {  // Q head i belongs to K/V head i / group (backward.py: torch.sum over dim 3, out=dk / dv)
    at::sum_out(dk, dk_h.view({b, sk, h_kv, group, d}), {3});
    at::sum_out(dv, dv_h.view({b, sk, h_kv, group, d_v}), {3});
  }
  return {dq, dk, dv};
}

// out = the forward's output, returned as a view whose grad_fn runs run_backward (q, k, v get the gradients).
struct AttentionBackwardNode : public torch::autograd::Function<AttentionBackwardNode> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor q, at::Tensor k, at::Tensor v,
                            at::Tensor out, at::Tensor lse, int64_t plan_id, double scale) {
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["plan"] = plan_id;
    ctx->saved_data["scale"] = scale;
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto s = ctx->get_saved_variables();
    auto g = run_backward(s[0], s[1], s[2], s[3], grads[0], s[4], ctx->saved_data["plan"].toInt(),
                          ctx->saved_data["scale"].toDouble());
    return {g[0], g[1], g[2], at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor attach(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out, at::Tensor lse, int64_t plan_id,
                  double scale) {
  plan_at(plan_id);  // an unknown id fails here, not in the backward
  return AttentionBackwardNode::apply(q, k, v, out, lse, plan_id, scale);
}

int64_t register_plan(int64_t pre, int64_t main, int64_t post, int64_t tile_m, int64_t q_pad_rows, int64_t sem_rows,
                      int64_t sem_mult, int64_t tile_n, int64_t ctas, bool zero_sem, bool stream_pre,
                      bool stream_post) {
  TORCH_CHECK(pre != 0 && main != 0 && post != 0, "fa4lab backward node: a null kernel handle");
  TORCH_CHECK(tile_m > 0 && sem_rows > 0 && sem_mult > 0 && tile_n > 0, "fa4lab backward node: bad plan sizes");
  auto plan = std::make_unique<Plan>(Plan{reinterpret_cast<void*>(pre), reinterpret_cast<void*>(main),
                                          reinterpret_cast<void*>(post), tile_m, q_pad_rows, sem_rows, sem_mult,
                                          tile_n, ctas, zero_sem, stream_pre, stream_post});
  std::lock_guard<std::mutex> lock(g_mu);
  g_plans.push_back(std::move(plan));
  return static_cast<int64_t>(g_plans.size()) - 1;
}

void set_api(int64_t call, int64_t set_stream, int64_t move_error, int64_t dec_ref) {
  TORCH_CHECK(call != 0 && set_stream != 0, "fa4lab backward node: TVMFFIFunctionCall / TVMFFIEnvSetStream missing");
  g_api = Api{reinterpret_cast<CallFn>(call), reinterpret_cast<SetStreamFn>(set_stream),
              reinterpret_cast<MoveErrorFn>(move_error), reinterpret_cast<DecRefFn>(dec_ref)};
}

// ---- a fake TVM FFI for the CPU tests: records each call's arguments (kind, shape or value) ----------------------
using Recorded = std::vector<std::tuple<int64_t, std::vector<std::tuple<int64_t, std::vector<int64_t>, double>>>>;
Recorded g_recorded;
int64_t g_fake_streams = 0;

int fake_call(void* func, FFIAny* args, int32_t n, FFIAny* result) {
  std::vector<std::tuple<int64_t, std::vector<int64_t>, double>> got;
  for (int32_t i = 0; i < n; ++i) {
    const FFIAny& a = args[i];
    if (a.type_index == kFFIDLTensorPtr) {
      auto* t = static_cast<DLTensor*>(a.v_ptr);
      std::vector<int64_t> shape(t->shape, t->shape + t->ndim);
      shape.push_back(t->dtype.code * 1000 + t->dtype.bits);  // the dtype after the dims
      got.emplace_back(a.type_index, shape, 0.0);
    } else {
      got.emplace_back(a.type_index, std::vector<int64_t>{},
                       a.type_index == kFFIFloat ? a.v_float64 : static_cast<double>(a.v_int64));
    }
  }
  g_recorded.emplace_back(reinterpret_cast<int64_t>(func), got);
  result->type_index = kFFINone;
  return reinterpret_cast<int64_t>(func) == 13 ? -1 : 0;  // handle 13: a kernel that fails
}
int fake_set_stream(int32_t, int32_t, void*, void** original) {
  ++g_fake_streams;
  if (original != nullptr) *original = nullptr;
  return 0;
}

std::vector<int64_t> fake_api() {
  return {reinterpret_cast<int64_t>(&fake_call), reinterpret_cast<int64_t>(&fake_set_stream)};
}
Recorded fake_calls() {
  Recorded r;
  r.swap(g_recorded);
  return r;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "fa4lab: the eager attention backward as a C++ autograd node (kernels/sm90/cpp_backward.py)";
  m.def("set_api", &set_api, "TVM FFI entry points: TVMFFIFunctionCall, TVMFFIEnvSetStream, "
        "TVMFFIErrorMoveFromRaised, TVMFFIObjectDecRef (addresses)");
  m.def("register_plan", &register_plan, "one compiled backward: its kernel handles and scratch sizes -> plan id");
  m.def("attach", &attach, "out as a view whose grad_fn is the C++ backward node");
  m.def("run_backward", &run_backward, "the backward alone: (dq, dk, dv)");
  m.def("fake_api", &fake_api, "tests: addresses of a recording TVMFFIFunctionCall / TVMFFIEnvSetStream");
  m.def("fake_calls", &fake_calls, "tests: the calls recorded since the last read");
}
