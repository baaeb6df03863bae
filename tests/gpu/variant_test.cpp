// The choice of a kernel variant (src/cuda/common/variant.h): the requested one, the default, or,
// where the default needs more shared memory than the device offers, the first one that fits.
// Host logic only: runs without a GPU.
#include <gtest/gtest.h>

#include <array>

#include "cuda/common/variant.h"

namespace fmha::cuda {
namespace {

constexpr int kCount = 3;
constexpr int kDefault = 2;
constexpr const char* kNames[kCount] = {"small", "medium", "large"};

// The variant that runs (or -1 when the call is refused) for `requested` on a device where
// variant v fits iff fits[v].
template <bool TUNED = true, int EXTRA = -1>
int chosen(int requested, std::array<bool, kCount> fits) {
  int ran = -1;
  const Status status = with_requested_variant<kCount, kDefault, TUNED, EXTRA>(
      requested, "FMHA_TEST_CONFIG", kNames, [&](auto v) { return fits[decltype(v)::value]; },
      [&](auto v) {
        ran = decltype(v)::value;
        return Status::success();
      });
  return status.ok() ? ran : -1;
}

TEST(Variants, DefaultRunsWhereItFits) { EXPECT_EQ(chosen(kDefaultVariant, {true, true, true}), kDefault); }

TEST(Variants, DefaultGivesWayToTheFirstVariantThatFits) {
  EXPECT_EQ(chosen(kDefaultVariant, {false, true, false}), 1);
  EXPECT_EQ(chosen(kDefaultVariant, {true, true, false}), 0);
}

TEST(Variants, NothingFitsKeepsTheDefaultForTheCallerToReport) {
  EXPECT_EQ(chosen(kDefaultVariant, {false, false, false}), kDefault);
}

TEST(Variants, AnExplicitRequestIsHonouredEvenWhereItDoesNotFit) {
  EXPECT_EQ(chosen(0, {false, true, true}), 0);
  EXPECT_EQ(chosen(1, {true, false, true}), 1);
}

TEST(Variants, UnknownNameIsRefused) { EXPECT_EQ(chosen(kUnknownVariant, {true, true, true}), -1); }

TEST(Variants, HeadDimsWithoutEveryVariantRunTheDefault) {
  EXPECT_EQ(chosen<false>(0, {true, true, false}), kDefault);
  EXPECT_EQ(chosen<false>(kDefaultVariant, {true, true, false}), kDefault);
}

// A variant compiled at more head dims (sm80's compact) is the fallback there, and can be asked for.
TEST(Variants, ExtraVariantAtHeadDimsWithoutEveryVariant) {
  constexpr int kExtra = 0;
  EXPECT_EQ((chosen<false, kExtra>(kDefaultVariant, {true, false, false})), kExtra);  // default does not fit
  EXPECT_EQ((chosen<false, kExtra>(kDefaultVariant, {true, false, true})), kDefault);
  EXPECT_EQ((chosen<false, kExtra>(kDefaultVariant, {false, false, false})), kDefault);  // reported by the caller
  EXPECT_EQ((chosen<false, kExtra>(kExtra, {false, false, true})), kExtra);                // asked for by name
  EXPECT_EQ((chosen<false, kExtra>(1, {true, true, true})), kDefault);  // not compiled here: the default
}

}  // namespace
}  // namespace fmha::cuda
