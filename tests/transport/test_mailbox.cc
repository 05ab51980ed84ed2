// The shared-memory mailbox (transport/mailbox.h) on its own: three ranks' areas in this
// process's memory, driven by one thread in lockstep, so that every case is deterministic.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "transport/mailbox.h"

namespace braid {
namespace {

constexpr int kRanks = 3;

struct Host {
  std::unique_ptr<MailboxArea[]> areas{new MailboxArea[kRanks]};
  std::unique_ptr<Doorbell[]> bells{new Doorbell[kRanks]};
  std::vector<std::unique_ptr<Mailbox>> boxes;
  Host() {
    for (int r = 0; r < kRanks; ++r) boxes.push_back(std::make_unique<Mailbox>(areas.get(), bells.get(), r, kRanks));
  }
  Mailbox& operator[](int r) { return *boxes[static_cast<std::size_t>(r)]; }
};

std::byte pattern(int rank, std::uint64_t seq, std::size_t i) {
  return static_cast<std::byte>((rank * 131 + seq * 7 + i * 13) & 0xff);
}

TEST(Mailbox, EveryRankReadsEveryOthersMessageIntactOverManyCallsAndSizes) {
  Host h;
  for (std::uint64_t seq = 1; seq <= 600; ++seq) {
    const std::size_t bytes = seq % 5 == 0 ? Mailbox::kMaxBytes : (seq * 37) % (Mailbox::kMaxBytes + 1);
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_TRUE(h[r].canPost(seq)) << "rank " << r << " seq " << seq;
      std::byte* p = h[r].payloadFor(seq);
      for (std::size_t i = 0; i < bytes; ++i) p[i] = pattern(r, seq, i);
      const std::uint64_t tag[3] = {seq * 10 + static_cast<std::uint64_t>(r), 0, bytes};
      h[r].publish(seq, tag);
    }
    for (int r = 0; r < kRanks; ++r) {
      for (int q = 0; q < kRanks; ++q) {
        if (q == r) continue;
        const MailboxSlot* s = h[r].arrived(q, seq);
        ASSERT_NE(s, nullptr) << "rank " << r << " waits for rank " << q << " seq " << seq;
        ASSERT_EQ(s->seq.load(), seq);
        ASSERT_EQ(s->tag[0], seq * 10 + static_cast<std::uint64_t>(q));
        ASSERT_EQ(s->tag[2], bytes);
        for (std::size_t i = 0; i < bytes; ++i) ASSERT_EQ(s->payload[i], pattern(q, seq, i)) << "byte " << i;
      }
      h[r].finished(seq);
    }
  }
}

TEST(Mailbox, AMessageNotYetPostedIsNotSeenAndAnOlderOneIsNotMistakenForIt) {
  Host h;
  const std::uint64_t tag[3] = {};
  EXPECT_EQ(h[1].arrived(0, 1), nullptr);
  EXPECT_EQ(h[0].firstMissing(1), 1);
  h[0].publish(1, tag);
  EXPECT_EQ(h[1].firstMissing(1), 2);  // rank 0's is there; rank 2's is not
  EXPECT_NE(h[1].arrived(0, 1), nullptr);
  EXPECT_EQ(h[1].arrived(0, 3), nullptr);  // same slot, still holding #1
}

TEST(Mailbox, ASlotIsReusedOnlyAfterEveryReaderFinishedItsMessage) {
  Host h;
  const std::uint64_t tag[3] = {};
  ASSERT_TRUE(h[0].canPost(1));
  h[0].publish(1, tag);
  ASSERT_TRUE(h[0].canPost(2));  // the other slot
  h[0].publish(2, tag);
  EXPECT_FALSE(h[0].canPost(3)) << "ranks 1 and 2 have not read #1 yet";
  EXPECT_EQ(h[0].firstBusyReader(3), 1);
  h[1].finished(1);
  EXPECT_FALSE(h[0].canPost(3)) << "rank 2 has not read #1 yet";
  EXPECT_EQ(h[0].firstBusyReader(3), 2);
  // Rank 2 posting #2 says it finished #1, without its done word.
  h[2].publish(2, tag);
  ASSERT_NE(h[0].arrived(2, 2), nullptr);
  EXPECT_TRUE(h[0].canPost(3));
}

// The answer word of CUDA IPC send/recv: a value written into another rank's area is what that rank
// reads; clearing it forgets the last one.
TEST(Mailbox, AnAnswerReachesTheRankItIsForAndClearingForgetsIt) {
  Host h;
  EXPECT_EQ(h[0].answerReceived(), 0u);
  h[2].answer(0, 0x700000005ull);
  EXPECT_EQ(h[0].answerReceived(), 0x700000005ull);
  EXPECT_EQ(h[1].answerReceived(), 0u);
  EXPECT_EQ(h[2].answerReceived(), 0u);
  h[0].clearAnswer();
  EXPECT_EQ(h[0].answerReceived(), 0u);
}

}  // namespace
}  // namespace braid
