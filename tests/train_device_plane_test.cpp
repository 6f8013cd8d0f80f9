// Which GPU a rank takes and whether its device plane is staged (train/device_plane.h), decided from the numbers
// alone: the oracle is the rule written out by hand for each case.
#include <gtest/gtest.h>

#include "megatrain/core/error.h"
#include "megatrain/train/device_plane.h"

using namespace mt;

namespace {

TEST(DevicePlane, AutoIsNcclWhenEveryLocalRankHasAGpuAndStagedWhenTheyShare) {
  for (int r = 0; r < 4; ++r) {
    DevicePlaneDecision own = decide_device_plane(DevicePlane::Auto, r, 4, 8);
    EXPECT_FALSE(own.staged);
    EXPECT_EQ(own.gpu, r);
    DevicePlaneDecision one = decide_device_plane(DevicePlane::Auto, r, 4, 1);
    EXPECT_TRUE(one.staged);
    EXPECT_EQ(one.gpu, 0);
    DevicePlaneDecision two = decide_device_plane(DevicePlane::Auto, r, 4, 2);
    EXPECT_TRUE(two.staged);
    EXPECT_EQ(two.gpu, r % 2);  // ranks spread over the GPUs: 0,1,0,1
  }
  EXPECT_NE(decide_device_plane(DevicePlane::Auto, 0, 8, 1).why.find("8 local ranks on 1 GPU: they share"),
            std::string::npos);
  EXPECT_NE(decide_device_plane(DevicePlane::Auto, 0, 2, 2).why.find("NCCL (2 local ranks on 2 GPUs: a GPU each)"),
            std::string::npos);
}

TEST(DevicePlane, StagedIsKeptEvenWithAGpuPerRank) {
  DevicePlaneDecision d = decide_device_plane(DevicePlane::Staged, 1, 2, 2);
  EXPECT_TRUE(d.staged);
  EXPECT_EQ(d.gpu, 1);
  EXPECT_NE(d.why.find("as parallel.device_plane asks"), std::string::npos) << d.why;
}

TEST(DevicePlane, NcclOnASharedGpuIsAConfigErrorNamingTheRanksAndTheGpu) {
  try {
    decide_device_plane(DevicePlane::Nccl, 0, 3, 2);
    FAIL() << "nccl with 3 local ranks on 2 GPUs was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind, ErrorKind::Config);
    EXPECT_NE(std::string(e.what()).find("3 local ranks see 2 GPUs: local rank 2 would share GPU 0 with local rank 0"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(decide_device_plane(DevicePlane::Nccl, 1, 2, 2).staged);
}

TEST(DevicePlane, NoVisibleGpuIsAConfigError) {
  try {
    decide_device_plane(DevicePlane::Auto, 0, 2, 0);
    FAIL() << "no GPU was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind, ErrorKind::Config);
    EXPECT_NE(std::string(e.what()).find("no CUDA device is visible"), std::string::npos) << e.what();
  }
}

}  // namespace
