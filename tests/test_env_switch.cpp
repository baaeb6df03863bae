// The GPU tiers' measurement switches (src/common/env_switch.h): the named value picked, the
// default (the first value) when unset, empty or unknown, and a warning naming the variable, the
// text and the values it takes only for unknown text.
#include <gtest/gtest.h>

#include <iterator>
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

// Every switch the tiers read: the variable and the value the README and docs/PERF.md give for
// the switched behaviour, off when unset, empty, set to the default or to unknown text (which
// warns), on only for its value.
TEST(EnvSwitch, EachSwitchIsOnForItsDocumentedValueAlone) {
  struct Expected {
    const NamedSwitch& s;
    const char* variable;
    const char* default_value;
    const char* on;
  };
  for (const Expected& e : {Expected{kSm90StaticSchedule, "FMHA_SM90_SCHEDULER", "dynamic", "static"},
                            Expected{kSm90HeadsTogether, "FMHA_SM90_FWD_ORDER", "tiles", "heads"},
                            Expected{kSm90PairsAlone, "FMHA_SM90_BWD_ORDER", "sections", "keys"},
                            Expected{kNoDependentLaunch, "FMHA_DEPENDENT_LAUNCH", "1", "0"}}) {
    SCOPED_TRACE(e.variable);
    EXPECT_STREQ(e.s.variable, e.variable);
    EXPECT_STREQ(e.s.values[0], e.default_value);
    EXPECT_STREQ(e.s.values[1], e.on) << "the other value is the one that switches";
    std::string warning;
    for (const char* off : {static_cast<const char*>(nullptr), "", e.default_value}) {
      EXPECT_FALSE(switch_on(e.s, off, &warning)) << (off ? off : "(unset)");
      EXPECT_TRUE(warning.empty()) << warning;
    }
    EXPECT_TRUE(switch_on(e.s, e.on, &warning));
    EXPECT_TRUE(warning.empty()) << warning;
    EXPECT_FALSE(switch_on(e.s, "on", &warning)) << "unknown text gives the default";
    EXPECT_NE(warning.find(e.variable), std::string::npos) << warning;
  }
}

// FMHA_DECODE_SHAPE: each shape's name picks its index in the order the launcher's switch takes
// them; unset, empty or unknown text the default (unknown text with the list).
TEST(EnvSwitch, DecodeShapeNamesPickTheirShape) {
  const char* names[] = {"default", "s2", "s4", "k128s2", "k128s3", "l2", "bulk", "k128bulk"};
  ASSERT_EQ(std::size(names), kDecodeShapes.size());
  for (int i = 0; i < int(kDecodeShapes.size()); ++i) {
    const SwitchChoice c = choose_decode_shape(names[i]);
    EXPECT_EQ(c.index, i) << names[i];
    EXPECT_TRUE(c.warning.empty()) << c.warning;
  }
  for (const char* unset : {static_cast<const char*>(nullptr), ""}) EXPECT_EQ(choose_decode_shape(unset).index, 0);
  const SwitchChoice unknown = choose_decode_shape("k256");
  EXPECT_EQ(unknown.index, 0);
  EXPECT_EQ(unknown.warning,
            "FMHA_DECODE_SHAPE=k256 is not one of default, s2, s4, k128s2, k128s3, l2, bulk, k128bulk; using default");
}

}  // namespace
}  // namespace fmha
