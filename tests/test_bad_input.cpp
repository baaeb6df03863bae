// Every invalid call returns an error that names the argument and writes nothing.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "test_util.h"

namespace fmha {
namespace {

using testing::HostTensor;
using testing::Problem;

constexpr float kSentinel = 777.0f;

struct BadCase {
  const char* name;
  Direction direction;
  Code code;
  const char* mentions;  // the message must contain this
  std::function<void(Params&, Problem&)> edit;
};

std::vector<BadCase> bad_cases() {
  using D = Direction;
  static HostTensor wrong_k(DType::fp32, {2, 9, 3, 32});  // batch 2, heads 3
  static HostTensor fp16_k(DType::fp16, {1, 9, 2, 32});
  static HostTensor bf16_lse(DType::bf16, {1, 4, 8});
  static HostTensor small_lse(DType::fp32, {1, 4, 7});
  static HostTensor rank3(DType::fp32, {8, 4, 32});
  static HostTensor big_dim_q(DType::fp32, {1, 8, 4, 2048}), big_dim_k(DType::fp32, {1, 9, 2, 2048});
  static HostTensor big_dim_o(DType::fp32, {1, 8, 4, 16});
  return {
      {"q_rank", D::forward, Code::invalid_argument, "q:", [](Params& p, Problem&) { p.q = rank3.view; }},
      {"k_batch", D::forward, Code::invalid_argument, "k:", [](Params& p, Problem&) { p.k = wrong_k.view; }},
      {"k_head_dim", D::forward, Code::invalid_argument, "k: head_dim",
       [](Params& p, Problem&) { p.k.shape[3] = 16; }},
      {"v_seqlen", D::forward, Code::invalid_argument, "v: seqlen_k", [](Params& p, Problem&) { p.v.shape[1] = 3; }},
      {"v_kv_heads", D::forward, Code::invalid_argument, "v: kv_heads", [](Params& p, Problem&) { p.v.shape[2] = 1; }},
      {"o_shape", D::forward, Code::invalid_argument, "o: head_dim_v", [](Params& p, Problem&) { p.o.shape[3] = 8; }},
      {"heads_not_multiple", D::forward, Code::invalid_argument, "kv_heads",
       [](Params& p, Problem&) { p.k.shape[2] = p.v.shape[2] = 3; }},
      {"dtype_mismatch", D::forward, Code::invalid_argument, "k: dtype", [](Params& p, Problem&) { p.k = fp16_k.view; }},
      {"device_mismatch", D::forward, Code::invalid_argument, "v: is on a different device",
       [](Params& p, Problem&) { p.v.device = Device{DeviceType::cuda, 0}; }},
      {"null_pointer", D::forward, Code::invalid_argument, "k: data pointer is null",
       [](Params& p, Problem&) { p.k.data = nullptr; }},
      {"misaligned_pointer", D::forward, Code::invalid_argument, "q: data pointer is not aligned",
       [](Params& p, Problem&) { p.q.data = static_cast<char*>(p.q.data) + 1; }},
      {"non_contiguous_last_dim", D::forward, Code::invalid_argument, "v: the last dimension",
       [](Params& p, Problem&) { p.v.stride[3] = 2; }},
      {"negative_size", D::forward, Code::invalid_argument, "q: seqlen_q is -8",
       [](Params& p, Problem&) { p.q.shape[1] = -8; }},
      {"negative_stride", D::forward, Code::invalid_argument, "k: stride of seqlen_k",
       [](Params& p, Problem&) { p.k.stride[1] = -64; }},
      {"zero_head_dim", D::forward, Code::invalid_argument, "q: head_dim is 0",
       [](Params& p, Problem&) { p.q.shape[3] = p.k.shape[3] = 0; }},
      {"lse_dtype", D::forward, Code::invalid_argument, "lse: dtype", [](Params& p, Problem&) { p.lse = bf16_lse.view; }},
      {"lse_shape", D::forward, Code::invalid_argument, "lse: seqlen_q", [](Params& p, Problem&) { p.lse = small_lse.view; }},
      {"window_left", D::forward, Code::invalid_argument, "window_left", [](Params& p, Problem&) { p.window_left = -2; }},
      {"window_right", D::forward, Code::invalid_argument, "window_right", [](Params& p, Problem&) { p.window_right = -5; }},
      {"window_contradicts_causal", D::forward, Code::invalid_argument, "window_right",
       [](Params& p, Problem&) {
         p.causal = Causal::top_left;
         p.window_right = 4;
       }},
      {"causal_value", D::forward, Code::invalid_argument, "causal",
       [](Params& p, Problem&) { p.causal = static_cast<Causal>(9); }},
      {"tf32_with_fp16", D::forward, Code::invalid_argument, "precision",
       [](Params& p, Problem& pr) {
         static Problem half(1, 4, 2, 8, 9, 32, 16, DType::fp16);
         p = half.params();
         p.precision = Precision::tf32;
         (void)pr;
       }},
      {"tf32x3_with_bf16", D::backward, Code::invalid_argument, "precision",
       [](Params& p, Problem& pr) {
         static Problem bf16(1, 4, 2, 8, 9, 32, 16, DType::bf16);
         p = bf16.params();
         p.precision = Precision::tf32x3;
         (void)pr;
       }},
      {"precision_value", D::forward, Code::invalid_argument, "precision",
       [](Params& p, Problem&) { p.precision = static_cast<Precision>(7); }},
      {"scale_nan", D::forward, Code::invalid_argument, "softmax_scale",
       [](Params& p, Problem&) { p.softmax_scale = std::numeric_limits<float>::quiet_NaN(); }},
      {"num_threads", D::forward, Code::invalid_argument, "num_threads", [](Params& p, Problem&) { p.num_threads = -1; }},
      {"gpu_backend_without_gpu", D::forward, Code::no_device, "sm80",
       [](Params& p, Problem&) {
         for (Tensor* t : {&p.q, &p.k, &p.v, &p.o, &p.lse}) t->device = Device{DeviceType::cuda, 0};
         p.backend = Backend::cuda_sm80;
       }},
      {"cpu_backend_with_cuda_tensors", D::forward, Code::invalid_argument, "backend",
       [](Params& p, Problem&) {
         for (Tensor* t : {&p.q, &p.k, &p.v, &p.o, &p.lse}) t->device = Device{DeviceType::cuda, 0};
         p.backend = Backend::cpu;
       }},
      {"head_dim_above_cpu_limit", D::forward, Code::unsupported, "head_dim",
       [](Params& p, Problem&) {
         p.q = big_dim_q.view;
         p.k = big_dim_k.view;
         p.v.shape[3] = 16;
         p.o = big_dim_o.view;
         p.backend = Backend::cpu;  // the oracle has no limit
       }},
      {"backward_without_lse", D::backward, Code::invalid_argument, "lse", [](Params& p, Problem&) { p.lse = Tensor{}; }},
      {"backward_without_dout", D::backward, Code::invalid_argument, "dout", [](Params& p, Problem&) { p.dout = Tensor{}; }},
      {"backward_dq_shape", D::backward, Code::invalid_argument, "dq:", [](Params& p, Problem&) { p.dq.shape[1] = 2; }},
      {"backward_dk_dtype", D::backward, Code::invalid_argument, "dk: dtype",
       [](Params& p, Problem&) { p.dk = fp16_k.view; }},
      {"backward_dv_null", D::backward, Code::invalid_argument, "dv: data pointer is null",
       [](Params& p, Problem&) { p.dv.data = nullptr; }},
  };
}

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class BadInput : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadInput, NamesTheArgumentAndWritesNothing) {
  const BadCase& c = GetParam();
  for (Backend backend : {Backend::auto_select, Backend::cpu, Backend::reference}) {
    Problem pr(1, 4, 2, 8, 9, 32, 16);
    for (HostTensor* out : {&pr.o, &pr.lse, &pr.dq, &pr.dk, &pr.dv}) out->fill(kSentinel);
    Params p = pr.params(backend);
    c.edit(p, pr);
    if (std::string(c.name) == "gpu_backend_without_gpu" && devices().size() > 1)
      GTEST_SKIP() << "a CUDA device is present";
    const Status s = c.direction == Direction::forward ? forward(p) : backward(p);
    EXPECT_EQ(s.code, c.code) << c.name << ": " << s.message;
    EXPECT_NE(s.message.find(c.mentions), std::string::npos)
        << c.name << ": message '" << s.message << "' does not mention '" << c.mentions << "'";
    // supports() and select_backend() give the same answer without running anything.
    EXPECT_EQ(supports(p, c.direction).code, c.code);
    for (HostTensor* out : {&pr.o, &pr.lse, &pr.dq, &pr.dk, &pr.dv})
      for (int64_t i = 0; i < out->numel(); ++i) ASSERT_EQ(out->at(i), kSentinel) << c.name << ": output written";
  }
}

INSTANTIATE_TEST_SUITE_P(Api, BadInput, ::testing::ValuesIn(bad_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Api, ThrowIfErrorCarriesTheMessage) {
  Problem pr(1, 4, 2, 8, 9, 32, 16);
  Params p = pr.params();
  p.window_left = -3;
  try {
    throw_if_error(forward(p));
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("window_left"), std::string::npos);
  }
}

TEST(Api, SelectBackendAndWorkspace) {
  Problem pr(1, 4, 2, 8, 9, 32, 16);
  Params p = pr.params(Backend::auto_select);
  Backend chosen = Backend::auto_select;
  ASSERT_TRUE(select_backend(p, Direction::forward, &chosen).ok());
  EXPECT_EQ(chosen, Backend::cpu);
  size_t bytes = 1;
  ASSERT_TRUE(workspace_size(p, Direction::backward, &bytes).ok());
  EXPECT_EQ(bytes, 0u);
  Backend parsed;
  EXPECT_TRUE(parse("reference", &parsed));
  EXPECT_EQ(parsed, Backend::reference);
  EXPECT_FALSE(parse("nonsense", &parsed));
}

}  // namespace
}  // namespace fmha
