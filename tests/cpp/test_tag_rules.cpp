// The per-tag rules both groups apply (csrc/plan/tag_rules.h): the tag limit, deferred tags, and
// the window a call gets from a sealed or unsealed pool, and the tag of a call's backward.
#include <gtest/gtest.h>

#include <string>

#include "plan/plan.h"
#include "plan/tag_rules.h"

namespace fu_test {
namespace {

using fast_ulysses::backward_tag;
using fast_ulysses::check_tag_use;
using fast_ulysses::kMaxTags;
using fast_ulysses::PlanError;
using fast_ulysses::window_for_call;

std::string message_of(void (*call)()) {
  try {
    call();
  } catch (const PlanError& error) {
    return error.what();
  }
  return "";
}

TEST(TagRules, NewTagsUpToTheLimitAndKnownTagsAlways) {
  EXPECT_NO_THROW(check_tag_use("q", 0, false, false));
  EXPECT_NO_THROW(check_tag_use("q", kMaxTags - 1, false, false));
  EXPECT_NO_THROW(check_tag_use("q", kMaxTags, true, false));  // a tag already counted
  const std::string message = message_of([] { check_tag_use("x", kMaxTags, false, false); });
  EXPECT_NE(message.find("tag 'x' would be the group's tag number 257"), std::string::npos)
      << message;
  EXPECT_NE(message.find("at most 256 distinct tags"), std::string::npos) << message;
}

TEST(TagRules, BackwardTagAppendsTheSuffixEachTime) {
  EXPECT_EQ(backward_tag("q"), "q:grad");
  EXPECT_EQ(backward_tag(backward_tag("q")), "q:grad:grad");  // a double backward
}

TEST(TagRules, DeferredTagRefusedUntilBarrier) {
  const std::string message = message_of([] { check_tag_use("kv", 3, true, true); });
  EXPECT_NE(message.find("tag 'kv' was last used with barrier=False"), std::string::npos)
      << message;
  EXPECT_NE(message.find("group.barrier()"), std::string::npos) << message;
}

TEST(TagRules, UnsealedWindowsGrowByHalfAtLeast) {
  EXPECT_EQ(window_for_call("q", 100, -1, false), 100);   // first call: what it needs
  EXPECT_EQ(window_for_call("q", 0, -1, false), 0);       // an empty call still has a window
  EXPECT_EQ(window_for_call("q", 80, 100, false), 100);   // fits: the held window
  EXPECT_EQ(window_for_call("q", 101, 100, false), 150);  // outgrown: 1.5x the old
  EXPECT_EQ(window_for_call("q", 400, 100, false), 400);  // or what it needs, if more
}

TEST(TagRules, SealedPoolServesHeldWindowsOnly) {
  EXPECT_EQ(window_for_call("q", 100, 100, true), 100);
  EXPECT_EQ(window_for_call("q", 10, 100, true), 100);
  const std::string undeclared = message_of([] { window_for_call("o", 64, -1, true); });
  EXPECT_NE(undeclared.find("tag 'o' needs a window of 64 bytes but it was not declared"),
            std::string::npos)
      << undeclared;
  const std::string larger = message_of([] { window_for_call("o", 65, 64, true); });
  EXPECT_NE(larger.find("it was declared with 64"), std::string::npos) << larger;
  EXPECT_NE(larger.find("sealed by reserve()"), std::string::npos) << larger;
}

}  // namespace
}  // namespace fu_test
