// The node loader (data/node_loader.h) in one process and, for a reader that dies, two: a node's reader and feeds
// through real POSIX shared memory against the oracle of per-rank DataLoaders (the rows, positions and epochs each
// rank's own loader gives), shuffled, blended and resumed; a middle stage that takes no rows; a reader's error
// reaching every rank; a reader killed (kill -9) or stopped (SIGSTOP) making a waiting rank fail with the reader
// named, not hang. The timeouts only guard against a hang: nothing asserts how fast anything is.
#include <gtest/gtest.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>

#include "support/data_util.h"
#include "support/files.h"
#include "megatrain/core/error.h"
#include "megatrain/data/loader.h"
#include "megatrain/data/node_loader.h"
#include "megatrain/data/shard.h"

namespace mt {
namespace {

using mt::test::ScratchDir;
using testing::error_of;

// A split of `ntokens` (<= 1000) ids in shards of 149 tokens (windows cross shard boundaries).
struct Dataset {
  ScratchDir dir;
  explicit Dataset(int ntokens, int salt = 0) {
    ShardWriter w(dir.path, "train", 1001, 1000, 149);  // one vocabulary for every dataset (a blend needs it)
    std::vector<int32_t> doc(static_cast<size_t>(ntokens - 1));
    for (int i = 0; i < ntokens - 1; ++i) doc[static_cast<size_t>(i)] = (i * 7919 + salt) % (ntokens - 1);
    w.add_document(doc);
    w.finish();
  }
};

constexpr int kB = 2, kT = 8, kDp = 2;

// The plan of local rank `local` on a node of dp2 x tp2 (local ranks 0, 1: dp 0; 2, 3: dp 1).
NodeLoaderPlan tp2_plan(int local, const std::string& name) {
  NodeLoaderPlan p;
  p.name = name;
  p.local_rank = local;
  p.replicas = {0, 1};
  p.consumers = 4;
  p.consumer = local;
  p.replica = local / 2;
  p.slots = 3;
  p.timeout_s = 60;
  return p;
}

std::string segment_name(const std::string& what) {
  return "/megatrain-test-" + what + "-" + std::to_string(::getpid());
}

// Four ranks' loaders fed by one node reader, against four per-rank loaders, over `batches` batches.
void expect_fed_like_per_rank(const std::vector<DataSource>& src, bool shuffle, const LoaderState* from, int batches) {
  const std::string name = segment_name("fed");
  std::vector<std::unique_ptr<DataLoader>> fed, own;
  for (int local = 0; local < 4; ++local) {
    const int dp = local / 2;
    own.push_back(std::make_unique<DataLoader>(src, "train", kB, kT, shuffle, 7, dp, kDp, 2));
    fed.push_back(std::make_unique<DataLoader>(src, "train", kB, kT, shuffle, 7, dp, kDp, 0));
    std::unique_ptr<NodeReader> reader;
    if (local == 0)
      reader = std::make_unique<NodeReader>(tp2_plan(0, name),
                                            std::make_unique<DataLoader>(src, "train", kB, kT, shuffle, 7, 0, kDp, 0));
    fed.back()->set_row_feed(std::make_unique<NodeFeed>(tp2_plan(local, name), std::move(reader), kB, kT));
    if (from) {
      own.back()->restore(*from);
      fed.back()->restore(*from);
    }
  }
  EXPECT_EQ(::shm_open(name.c_str(), O_RDONLY, 0), -1) << "the last rank to map the segment removes its name";
  for (int i = 0; i < batches; ++i)
    for (int local = 0; local < 4; ++local) {
      const Batch want = own[size_t(local)]->next(), got = fed[size_t(local)]->next();
      ASSERT_EQ(got.x, want.x) << "batch " << i << " local rank " << local;
      ASSERT_EQ(got.y, want.y) << "batch " << i << " local rank " << local;
      ASSERT_EQ(got.epoch, want.epoch);
      ASSERT_EQ(got.cursor, want.cursor);
      ASSERT_EQ(got.taken, want.taken);
      ASSERT_EQ(fed[size_t(local)]->state(), own[size_t(local)]->state());
    }
}

TEST(NodeLoader, EachRankGetsTheRowsOfItsOwnLoaderShuffledOverSeveralEpochs) {
  Dataset d(1000);  // 124 windows: 31 global batches of 4 rows an epoch
  expect_fed_like_per_rank({{d.dir.path, 1.0}}, true, nullptr, 70);
}

TEST(NodeLoader, InOrderAndResumedAtASavedPosition) {
  Dataset d(1000);
  const LoaderState at{1, 40};
  expect_fed_like_per_rank({{d.dir.path, 1.0}}, false, &at, 20);
  expect_fed_like_per_rank({{d.dir.path, 1.0}}, true, &at, 20);
}

TEST(NodeLoader, ABlendGivesEachRankItsOwnLoadersRows) {
  Dataset a(1000), b(600, 3);
  expect_fed_like_per_rank({{a.dir.path, 2.0}, {b.dir.path, 1.0}}, true, nullptr, 40);
  LoaderState at;
  at.taken = {50, 30};
  at.since = {10, 6};
  expect_fed_like_per_rank({{a.dir.path, 2.0}, {b.dir.path, 1.0}}, true, &at, 10);
}

// A middle pipeline stage (consumer -1) computes its positions and copies no rows.
TEST(NodeLoader, AMiddleStageTakesNoRows) {
  Dataset d(1000);
  NodeLoaderPlan p = tp2_plan(1, segment_name("middle"));
  p.consumer = p.replica = -1;
  DataLoader own(d.dir.path, "train", kB, kT, true, 7, 1, kDp, 0), fed(d.dir.path, "train", kB, kT, true, 7, 1, kDp, 0);
  fed.set_row_feed(std::make_unique<NodeFeed>(p, nullptr, kB, kT));
  for (int i = 0; i < 5; ++i) {
    const Batch want = own.next(), got = fed.next();
    EXPECT_TRUE(got.x.empty() && got.y.empty());
    EXPECT_EQ(got.cursor, want.cursor);
  }
  EXPECT_EQ(fed.state(), own.state());
}

// A token over the model's vocabulary in an llm.c shard (no vocabulary of its own): the reader fails on its first
// read, and every rank throws the shard's error (kind Data) with the reader named.
TEST(NodeLoader, AReadersErrorReachesEveryRank) {
  ScratchDir dir;
  std::vector<uint32_t> toks(64, 1);
  toks[3] = 150;
  testing::write_bytes(dir.path + "/train_000000.bin", testing::llmc_shard_bytes({20240520, 1, 64}, toks, 2));
  const std::string name = segment_name("error");
  NodeLoaderPlan p = tp2_plan(0, name);
  p.replicas = {0};
  p.consumers = 2;
  p.replica = 0;
  auto reader = std::make_unique<NodeReader>(p, std::make_unique<DataLoader>(dir.path, "train", 1, 16, false, 0, 0, 1,
                                                                             0, /*id_limit=*/100));
  std::vector<std::unique_ptr<DataLoader>> ranks;
  for (int local = 0; local < 2; ++local) {
    NodeLoaderPlan mine = p;
    mine.local_rank = mine.consumer = local;
    ranks.push_back(std::make_unique<DataLoader>(dir.path, "train", 1, 16, false, 0, 0, 1, 0, 100));
    ranks.back()->set_row_feed(std::make_unique<NodeFeed>(mine, local == 0 ? std::move(reader) : nullptr, 1, 16));
  }
  for (int local = 0; local < 2; ++local) {
    try {
      ranks[size_t(local)]->next();
      ADD_FAILURE() << "local rank " << local << " read a batch";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind, ErrorKind::Data);
      const std::string m = e.what();
      EXPECT_NE(m.find(fmt::format("the data reader of node 0 (local rank 0, pid {}) failed", ::getpid())),
                std::string::npos)
          << m;
      EXPECT_NE(m.find("token 150 at index 3 is outside the model's vocabulary"), std::string::npos) << m;
    }
  }
}

// The reader in a child process (local rank 0 of the node), one consumer here; the child is then disturbed by
// `act` once the consumer has taken two batches. Returns the consumer's error (kind in *kind).
std::string disturbed_reader(const std::string& what, int signal, double timeout_s, ErrorKind* kind) {
  Dataset d(1000);
  NodeLoaderPlan p;
  p.name = segment_name(what);
  p.node = 3;
  p.replicas = {0};
  p.consumers = 1;
  p.slots = 2;
  p.timeout_s = timeout_s;
  int ready[2];
  EXPECT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    try {
      NodeReader reader(p, std::make_unique<DataLoader>(d.dir.path, "train", kB, kT, true, 7, 0, 1, 0));
      reader.start({});
      const char c = 1;
      (void)!::write(ready[1], &c, 1);
      for (;;) ::pause();
    } catch (...) {
    }
    ::_exit(1);
  }
  char c = 0;
  EXPECT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  ::close(ready[1]);
  NodeLoaderPlan mine = p;
  mine.local_rank = 1;
  mine.consumer = mine.replica = 0;
  DataLoader rank(d.dir.path, "train", kB, kT, true, 7, 0, 1, 0);
  rank.set_row_feed(std::make_unique<NodeFeed>(mine, nullptr, kB, kT));
  rank.next();
  rank.next();
  ::kill(child, signal);
  std::string m = "<no error>";
  for (int i = 0; i < 10; ++i) {  // at most `slots` batches were written before the signal
    try {
      rank.next();
    } catch (const Error& e) {
      m = fmt::format("pid {}: {}", child, e.what());
      *kind = e.kind;
      break;
    }
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  return m;
}

TEST(NodeLoader, AKilledReaderMakesAWaitingRankFailNamingIt) {
  ErrorKind kind = ErrorKind::Internal;
  const std::string m = disturbed_reader("killed", SIGKILL, 60, &kind);  // a zombie until reaped: still gone
  EXPECT_EQ(kind, ErrorKind::PeerLost) << m;
  const std::string pid = m.substr(4, m.find(':') - 4);
  EXPECT_NE(m.find("the data reader of node 3 (local rank 0, pid " + pid + ") is gone"), std::string::npos) << m;
}

TEST(NodeLoader, AStoppedReaderMakesAWaitingRankFailWithinTheTimeout) {
  ErrorKind kind = ErrorKind::Internal;
  const std::string m = disturbed_reader("stopped", SIGSTOP, 1.0, &kind);
  EXPECT_EQ(kind, ErrorKind::CommTimeout) << m;
  const std::string pid = m.substr(4, m.find(':') - 4);
  EXPECT_NE(m.find("the data reader of node 3 (local rank 0, pid " + pid + ") has not moved for"), std::string::npos)
      << m;
}

// A rank whose reader never comes (its segment never appears) fails after the timeout, naming the node's reader.
TEST(NodeLoader, AReaderThatNeverAppearsIsNamedAfterTheTimeout) {
  NodeLoaderPlan p = tp2_plan(1, segment_name("never"));
  p.node = 5;
  p.timeout_s = 0.3;
  try {
    NodeFeed feed(p, nullptr, kB, kT);
    ADD_FAILURE() << "opened a segment nobody made";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind, ErrorKind::PeerLost);
    EXPECT_NE(std::string(e.what()).find("the reader of node 5 (local rank 0) never set up shared memory"),
              std::string::npos)
        << e.what();
  }
}

TEST(NodeLoader, ProcessAliveTellsTheLivingFromTheDeadAndTheZombies) {
  EXPECT_TRUE(process_alive(::getpid()));
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  for (int i = 0; i < 1000 && process_alive(child); ++i) ::usleep(1000);
  EXPECT_FALSE(process_alive(child));  // a zombie: exited, not yet reaped
  ::waitpid(child, nullptr, 0);
  EXPECT_FALSE(process_alive(child));
  EXPECT_FALSE(process_alive(0));
}

}  // namespace
}  // namespace mt
