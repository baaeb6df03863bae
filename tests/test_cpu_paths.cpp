// The choice of the cpu backend's instruction-set path (src/cpu/isa.h): the run-time choice
// never takes a path the CPU lacks, FMHA_CPU_ISA forces a path, and a forced path that the build
// or the CPU lacks is refused with a message, never run.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/isa.h"
#include "cpu_path.h"
#include "test_util.h"

namespace fmha::cpu {
namespace {

IsaSet set_of(std::initializer_list<Isa> isas) {
  IsaSet s;
  for (Isa isa : isas) s.add(isa);
  return s;
}

// Every set that holds the portable path (the one that every build and CPU has).
std::vector<IsaSet> every_set_with_portable() {
  std::vector<IsaSet> sets;
  for (int bits = 0; bits < 1 << kIsaCount; ++bits) {
    IsaSet s = set_of({Isa::portable});
    for (Isa isa : kAllIsas)
      if ((bits >> int(isa)) & 1) s.add(isa);
    if (bits & 1) sets.push_back(s);
  }
  return sets;
}

TEST(CpuPaths, ChoiceIsTheFastestPathBothTheBuildAndTheCpuHave) {
  for (IsaSet compiled : every_set_with_portable())
    for (IsaSet cpu : every_set_with_portable()) {
      Isa chosen = Isa::avx512bf16;
      ASSERT_TRUE(choose_isa(compiled, cpu, nullptr, &chosen).ok());
      EXPECT_TRUE(compiled.has(chosen) && cpu.has(chosen))
          << to_string(chosen) << " chosen; compiled " << compiled.names() << ", cpu " << cpu.names();
      for (Isa faster : kAllIsas)
        if (int(faster) > int(chosen))
          EXPECT_FALSE(compiled.has(faster) && cpu.has(faster))
              << to_string(chosen) << " chosen over " << to_string(faster) << "; compiled " << compiled.names();
      Isa chosen_empty = Isa::avx512bf16;
      ASSERT_TRUE(choose_isa(compiled, cpu, "", &chosen_empty).ok());
      EXPECT_EQ(chosen_empty, chosen) << "an empty FMHA_CPU_ISA means no preference";
    }
}

// Paths passed over (measured slower on this CPU than the path before them) are skipped by the
// choice and taken only when forced; portable is never passed over.
TEST(CpuPaths, ChoiceSkipsPassedOverPathsUnlessForced) {
  const IsaSet passed[] = {set_of({Isa::avx512bf16}), set_of({Isa::avx512bf16, Isa::avx512}),
                           set_of({Isa::portable, Isa::avx2})};
  for (IsaSet compiled : every_set_with_portable())
    for (IsaSet cpu : every_set_with_portable())
      for (IsaSet skip : passed) {
        Isa chosen = Isa::amxbf16;
        ASSERT_TRUE(choose_isa(compiled, cpu, nullptr, &chosen, skip).ok());
        EXPECT_TRUE(compiled.has(chosen) && cpu.has(chosen));
        EXPECT_TRUE(chosen == Isa::portable || !skip.has(chosen)) << to_string(chosen) << " was passed over";
        for (Isa faster : kAllIsas)
          if (int(faster) > int(chosen))
            EXPECT_FALSE(compiled.has(faster) && cpu.has(faster) && !skip.has(faster))
                << to_string(chosen) << " chosen over " << to_string(faster);
        for (Isa forced : kAllIsas)
          if (compiled.has(forced) && cpu.has(forced)) {
            ASSERT_TRUE(choose_isa(compiled, cpu, to_string(forced), &chosen, skip).ok());
            EXPECT_EQ(chosen, forced) << "a forced path is taken even when passed over";
          }
      }
  const IsaSet no_amx = set_of({Isa::portable, Isa::avx2, Isa::avx512, Isa::avx512bf16});
  Isa chosen = Isa::portable;
  ASSERT_TRUE(choose_isa(no_amx, no_amx, nullptr, &chosen, set_of({Isa::avx512bf16})).ok());
  EXPECT_EQ(chosen, Isa::avx512) << "bf16 widened on the avx512 path where the dot product is slow";
}

// The rule that passes avx512bf16 over: the dot product must give at least 1.25x the FMA's
// multiply-adds per second (the rates measured on the 2-core Intel Xeon of docs/PERF.md: 44.7 vs
// 83.0 G/s, passed over).
TEST(CpuPaths, DotProductPaysOnlyAtAQuarterMoreThanTheFma) {
  EXPECT_FALSE(dot_product_pays(44.7e9, 83.0e9));
  EXPECT_FALSE(dot_product_pays(83.0e9, 83.0e9)) << "level rates: the widened path needs no conversions";
  EXPECT_FALSE(dot_product_pays(1.24 * 83.0e9, 83.0e9));
  EXPECT_TRUE(dot_product_pays(1.25 * 83.0e9, 83.0e9));
  EXPECT_TRUE(dot_product_pays(2.0 * 83.0e9, 83.0e9));
}

// This CPU's own answer: what it passes over it runs, says why (the measured rates), and still
// takes when forced.
TEST(CpuPaths, PassedOverPathsAreMeasuredHere) {
  const IsaSet runnable = compiled_isas() & cpu_isas();
  for (Isa isa : kAllIsas) {
    EXPECT_EQ(cpu_passed_over().has(isa), !cpu_passed_over_why(isa).empty()) << to_string(isa);
    if (!cpu_passed_over().has(isa)) continue;
    EXPECT_TRUE(runnable.has(isa)) << to_string(isa) << " is passed over but cannot run here";
    EXPECT_NE(cpu_passed_over_why(isa).find("measured"), std::string::npos) << cpu_passed_over_why(isa);
    const testing::ForceCpuPath force(to_string(isa));
    EXPECT_EQ(cpu_paths().selected, to_string(isa));
  }
  EXPECT_FALSE(cpu_passed_over().has(Isa::portable));
  const testing::ForceCpuPath no_preference("");
  const CpuPaths paths = cpu_paths();
  size_t passed = 0;
  for (Isa isa : kAllIsas) passed += cpu_passed_over().has(isa) ? 1 : 0;
  EXPECT_EQ(paths.passed_over.size(), passed);
  if (cpu_passed_over().has(Isa::avx512bf16)) EXPECT_EQ(paths.selected, "avx512");
}

TEST(CpuPaths, ForcedPathIsTakenWhenBothHaveIt) {
  for (IsaSet compiled : every_set_with_portable())
    for (IsaSet cpu : every_set_with_portable())
      for (Isa forced : kAllIsas) {
        Isa chosen = Isa::portable;
        const Status s = choose_isa(compiled, cpu, to_string(forced), &chosen);
        if (compiled.has(forced) && cpu.has(forced)) {
          EXPECT_TRUE(s.ok()) << s.message;
          EXPECT_EQ(chosen, forced);
        } else {
          EXPECT_EQ(s.code, Code::unsupported) << to_string(forced) << " forced; compiled " << compiled.names()
                                               << ", cpu " << cpu.names();
          EXPECT_EQ(chosen, Isa::portable) << "a refused choice must leave the output alone";
          EXPECT_NE(s.message.find(std::string("FMHA_CPU_ISA=") + to_string(forced)), std::string::npos) << s.message;
        }
      }
}

// The amxbf16 path is never taken on a CPU without it, whatever the build has, and forcing it
// there is refused with the paths the CPU runs; where the CPU runs it, it is taken.
TEST(CpuPaths, AmxPathOnlyWhereTheCpuHasIt) {
  const IsaSet all = set_of({Isa::portable, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amxbf16});
  const IsaSet no_amx = set_of({Isa::portable, Isa::avx2, Isa::avx512, Isa::avx512bf16});
  Isa chosen = Isa::portable;
  ASSERT_TRUE(choose_isa(all, no_amx, nullptr, &chosen).ok());
  EXPECT_EQ(chosen, Isa::avx512bf16);
  ASSERT_TRUE(choose_isa(all, all, nullptr, &chosen).ok());
  EXPECT_EQ(chosen, Isa::amxbf16) << "the fastest path both have";
  ASSERT_TRUE(choose_isa(all, all, "amxbf16", &chosen).ok());
  EXPECT_EQ(chosen, Isa::amxbf16);
  ASSERT_TRUE(choose_isa(no_amx, all, nullptr, &chosen).ok());
  EXPECT_EQ(chosen, Isa::avx512bf16) << "a build without the path";
  chosen = Isa::portable;
  const Status s = choose_isa(all, no_amx, "amxbf16", &chosen);
  EXPECT_EQ(s.code, Code::unsupported);
  EXPECT_EQ(s.message,
            "FMHA_CPU_ISA=amxbf16: this CPU cannot run that path (it can run portable, avx2, avx512, avx512bf16)");
  EXPECT_EQ(chosen, Isa::portable);
  ASSERT_TRUE(choose_isa(all, all, "avx512bf16", &chosen).ok());
  EXPECT_EQ(chosen, Isa::avx512bf16) << "an AMX CPU still runs the avx512bf16 path when it is forced";
}

// This CPU's own answer: amxbf16 is runnable exactly when the reason it is not is empty, and a
// CPU that cannot run it says why.
TEST(CpuPaths, AmxPathSaysWhyItIsNotRunHere) {
  EXPECT_EQ(cpu_isas().has(Isa::amxbf16), cpu_lacks(Isa::amxbf16).empty()) << cpu_lacks(Isa::amxbf16);
  for (Isa isa : kAllIsas) EXPECT_EQ(cpu_isas().has(isa), cpu_lacks(isa).empty()) << to_string(isa);
  if (!cpu_isas().has(Isa::amxbf16)) {
    const CpuPaths paths = cpu_paths();
    if (compiled_isas().has(Isa::amxbf16)) {
      bool said = false;
      for (const std::string& line : paths.not_runnable) said = said || line.rfind("amxbf16: ", 0) == 0;
      EXPECT_TRUE(said) << "cpu_paths().not_runnable does not say why amxbf16 is not run";
    }
    GTEST_SKIP() << "this CPU cannot run the amxbf16 path: " << cpu_lacks(Isa::amxbf16);
  }
}

TEST(CpuPaths, ForcedPathTheCpuLacksIsRefusedWithAMessage) {
  const IsaSet all = set_of({Isa::portable, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amxbf16});
  Isa chosen = Isa::portable;
  const Status s = choose_isa(all, set_of({Isa::portable, Isa::avx2}), "avx512", &chosen);
  EXPECT_EQ(s.code, Code::unsupported);
  EXPECT_EQ(s.message, "FMHA_CPU_ISA=avx512: this CPU cannot run that path (it can run portable, avx2)");
  const Status missing = choose_isa(set_of({Isa::portable}), all, "avx2", &chosen);
  EXPECT_EQ(missing.code, Code::unsupported);
  EXPECT_EQ(missing.message, "FMHA_CPU_ISA=avx2: this build has no such path (it has portable)");
  const Status unknown = choose_isa(all, all, "avx1024", &chosen);
  EXPECT_EQ(unknown.code, Code::invalid_argument);
  EXPECT_NE(unknown.message.find("not a CPU path"), std::string::npos) << unknown.message;
  EXPECT_EQ(chosen, Isa::portable);
}

// The CPU's feature flags as Linux reports them (it hides those the kernel does not enable).
std::set<std::string> proc_cpuinfo_flags() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line))
    if (line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      return {std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
    }
  return {};
}

TEST(CpuPaths, RuntimeChoiceMatchesTheCpuFlagsOfProcCpuinfo) {
#if !(defined(__linux__) && (defined(__x86_64__) || defined(__i386__)))
  GTEST_SKIP() << "needs /proc/cpuinfo of an x86 CPU";
#else
  const std::set<std::string> flags = proc_cpuinfo_flags();
  ASSERT_FALSE(flags.empty());
  auto all_of = [&](std::initializer_list<const char*> names) {
    for (const char* name : names)
      if (!flags.count(name)) return false;
    return true;
  };
  IsaSet expected = set_of({Isa::portable});
  if (all_of({"avx2", "fma"})) {
    expected.add(Isa::avx2);
    if (all_of({"avx512f", "avx512bw", "avx512dq", "avx512vl"})) {
      expected.add(Isa::avx512);
      if (all_of({"avx512_bf16"})) {
        expected.add(Isa::avx512bf16);
        // The tiles also need the process's permission (arch_prctl), which the flags cannot tell.
        if (all_of({"amx_tile", "amx_bf16"}) && cpu_lacks(Isa::amxbf16).find("arch_prctl") == std::string::npos)
          expected.add(Isa::amxbf16);
      }
    }
  }
  const IsaSet detected = cpu_isas();
  for (Isa isa : kAllIsas)
    EXPECT_EQ(detected.has(isa), expected.has(isa))
        << to_string(isa) << ": /proc/cpuinfo flags disagree (" << cpu_lacks(isa) << ")";

  const testing::ForceCpuPath no_preference("");
  Isa chosen{};
  ASSERT_TRUE(selected_isa(&chosen).ok());
  EXPECT_TRUE(expected.has(chosen)) << "the run-time choice " << to_string(chosen) << " is not one this CPU runs";
  EXPECT_TRUE(compiled_isas().has(chosen));
  for (Isa faster : kAllIsas)
    if (int(faster) > int(chosen))
      EXPECT_FALSE(expected.has(faster) && compiled_isas().has(faster) && !cpu_passed_over().has(faster))
          << to_string(faster);
#endif
}

TEST(CpuPaths, PublicListsAgreeWithTheChoice) {
  const testing::ForceCpuPath no_preference("");
  const CpuPaths paths = cpu_paths();
  ASSERT_TRUE(paths.error.empty()) << paths.error;
  ASSERT_FALSE(paths.runnable.empty());
  EXPECT_EQ(paths.runnable.front(), "portable");
  std::string expected;  // the last runnable path not passed over
  for (const std::string& path : paths.runnable) {
    Isa isa{};
    ASSERT_TRUE(parse(path, &isa));
    if (!cpu_passed_over().has(isa)) expected = path;
  }
  EXPECT_EQ(paths.selected, expected);
  for (const std::string& path : paths.runnable) {
    const testing::ForceCpuPath force(path);
    EXPECT_EQ(cpu_paths().selected, path);
  }
}

// A whole call through the public API with FMHA_CPU_ISA set to a path that cannot run: refused
// before any kernel starts, outputs untouched.
void expect_refused(const std::string& value, Code code) {
  const testing::ForceCpuPath force(value);
  fmha::testing::Problem problem(1, 2, 2, 40, 50, 64, 64);
  problem.o.fill(7.0f);
  for (Backend backend : {Backend::cpu, Backend::auto_select}) {
    const Status s = forward(problem.params(backend));
    EXPECT_FALSE(s.ok()) << value;
    if (backend == Backend::cpu) EXPECT_EQ(s.code, code) << s.message;
    EXPECT_NE(s.message.find("FMHA_CPU_ISA=" + value), std::string::npos) << s.message;
    for (int64_t i = 0; i < problem.o.numel(); ++i) ASSERT_EQ(problem.o.at(i), 7.0f) << "a refused call wrote O";
  }
  EXPECT_FALSE(cpu_paths().error.empty());
  EXPECT_TRUE(cpu_paths().selected.empty());
}

TEST(CpuPaths, CallWithAnUnknownPathIsRefused) { expect_refused("sse9", Code::invalid_argument); }

TEST(CpuPaths, CallWithAPathThisMachineCannotRunIsRefused) {
  int refused = 0;
  for (Isa isa : kAllIsas)
    if (!(compiled_isas() & cpu_isas()).has(isa)) {
      expect_refused(to_string(isa), Code::unsupported);
      ++refused;
    }
  if (refused == 0) GTEST_SKIP() << "this build and CPU run every path";
}

}  // namespace
}  // namespace fmha::cpu
