// The GPU tiers' measurement switches (src/common/env_switch.h): the named value picked, the
// default (the first value) when unset, empty or unknown, and a warning naming the variable, the
// text and the values it takes only for unknown text.
#include <gtest/gtest.h>

#include <string>

#include "common/env_switch.h"

namespace fmha {
namespace {

TEST(EnvSwitch, NamedValuesPickedUnknownTextWarnsAndTakesTheDefault) {
  constexpr const char* kName = "FMHA_SM90_FWD_ORDER";
  for (const char* unset : {static_cast<const char*>(nullptr), ""}) {
    const SwitchChoice c = choose_switch(kName, unset, {"tiles", "heads"});
    EXPECT_EQ(c.index, 0);
    EXPECT_TRUE(c.warning.empty()) << c.warning;
  }
  EXPECT_EQ(choose_switch(kName, "tiles", {"tiles", "heads"}).index, 0);
  const SwitchChoice heads = choose_switch(kName, "heads", {"tiles", "heads"});
  EXPECT_EQ(heads.index, 1);
  EXPECT_TRUE(heads.warning.empty()) << heads.warning;
  for (const char* unknown : {"head", "HEADS", "heads ", "1"}) {
    const SwitchChoice c = choose_switch(kName, unknown, {"tiles", "heads"});
    EXPECT_EQ(c.index, 0) << unknown;
    EXPECT_EQ(c.warning, std::string(kName) + "=" + unknown + " is not one of tiles, heads; using tiles");
  }
  EXPECT_EQ(choose_switch("FMHA_DEPENDENT_LAUNCH", "0", {"1", "0"}).index, 1);
  EXPECT_EQ(choose_switch("FMHA_SM90_SCHEDULER", "static", {"dynamic", "static"}).index, 1);
}

}  // namespace
}  // namespace fmha
