// A buffer handed to a pending communication outlives it: over the in-order
// test communicator (NCCL's semantics: a send's data is read when it is
// matched, not when it is posted), two ranks as threads, and an allocator
// that hands a freed block to the next allocation at once, as a stream-
// ordered pool does on its stream. Rank 0 sends a buffer, frees it before
// rank 1 has posted the receive, and fills the next allocation (the same
// address) with other data: rank 1 must receive what was sent. The
// allocator asks kernels::buffer_uses() before a free, as CudaAllocator
// does; a communicator that does not record its buffers shows the hazard.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "in_order_comm.hpp"
#include "trident/core/allocator.hpp"
#include "trident/kernels/buffer_uses.hpp"

using namespace trident;

namespace {

// Freed blocks go back on a stack and come out again first, after
// buffer_uses() has had its say (the host's order_before: a wait).
class ReusingPool final : public Allocator {
 public:
  ~ReusingPool() override {
    for (void* p : blocks_) ::operator delete(p);
  }
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    if (!free_.empty()) {
      p = free_.back();
      free_.pop_back();
    } else {
      p = ::operator new(kBlock);
      blocks_.push_back(p);
    }
    REQUIRE(bytes <= kBlock);
    count_alloc(p, bytes);
    return p;
  }
  void deallocate(void* p, size_t bytes) noexcept override {
    count_free(p, bytes);
    kernels::buffer_uses().before_free(p, bytes, nullptr, 20.0);
    free_.push_back(p);
  }
  Device device() const override { return Device::cpu(); }

 private:
  static constexpr size_t kBlock = 4096;
  std::vector<void*> free_, blocks_;
};

constexpr size_t kFloats = 256;

struct Outcome {
  std::vector<float> received;
  bool reused = false;  // rank 0's second allocation had the first's address
};

// How rank 0 ends its send: waits for it after the free, tests it until
// done after the free, or drops its request before the free (released
// unwaited, as an exception unwinding past the wait does).
enum class SendEnd { wait_after_free, test_after_free, released };

// Rank 0 sends 1.0s and frees the buffer before rank 1 posts its receive
// (50 ms later), then fills its next allocation with 2.0s.
Outcome run_pair(bool record_uses, SendEnd end) {
  test::InOrderWorld world(2);
  test::InOrderComm c0(world, 0, 20.0, record_uses), c1(world, 1, 20.0, record_uses);
  Outcome out;
  out.received.assign(kFloats, 0.0f);
  std::thread receiver([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    Request r = c1.irecv(out.received.data(), kFloats * sizeof(float), 0, 5);
    c1.wait(r);
  });
  ReusingPool pool;
  const size_t bytes = kFloats * sizeof(float);
  auto* sent = static_cast<float*>(pool.allocate(bytes));
  std::fill_n(sent, kFloats, 1.0f);
  auto s = std::make_unique<Request>(c0.isend(sent, bytes, 1, 5));
  if (end == SendEnd::released) s.reset();
  pool.deallocate(sent, bytes);
  auto* next = static_cast<float*>(pool.allocate(bytes));
  out.reused = next == sent;
  std::fill_n(next, kFloats, 2.0f);  // what a later kernel writes there
  if (end == SendEnd::wait_after_free) c0.wait(*s);
  if (end == SendEnd::test_after_free)
    while (!c0.test(*s)) std::this_thread::yield();
  receiver.join();
  pool.deallocate(next, bytes);
  return out;
}

}  // namespace

TEST_CASE("a buffer freed while its send is pending is not reused before the send is done") {
  for (SendEnd end : {SendEnd::wait_after_free, SendEnd::test_after_free, SendEnd::released}) {
    INFO("send end " << int(end));
    const Outcome o = run_pair(true, end);
    CHECK(o.reused);  // the pool did hand the address out again...
    CHECK(o.received == std::vector<float>(kFloats, 1.0f));  // ...only after the send
  }
  CHECK(kernels::buffer_uses().recorded() == 0);  // every use ended and was dropped
}

TEST_CASE("without the recorded use the same free hands the data to the next allocation") {
  // The hazard the record prevents: the send reads the new owner's data.
  const Outcome o = run_pair(false, SendEnd::wait_after_free);
  CHECK(o.reused);
  CHECK(o.received == std::vector<float>(kFloats, 2.0f));
}

TEST_CASE("op_buffers: the extents a device backend records for each operation") {
  CommOp send{.kind = CommOp::Kind::send, .in = reinterpret_cast<const void*>(0x1000), .bytes = 64};
  auto b = op_buffers(send, 4);
  REQUIRE(b.size() == 1);
  CHECK(b[0].bytes == 64);
  float data[8];
  CommOp ar{.kind = CommOp::Kind::allreduce, .out = data, .count = 8, .type = ElemType::f32};
  b = op_buffers(ar, 4);
  REQUIRE(b.size() == 1);
  CHECK((b[0].ptr == data && b[0].bytes == 32));
  CommOp ag{.kind = CommOp::Kind::allgather, .in = data, .out = data, .bytes = 8};
  b = op_buffers(ag, 4);
  REQUIRE(b.size() == 2);
  CHECK(b[1].bytes == 32);  // every rank's block
  const int64_t counts[3] = {2, 0, 3}, displs[3] = {4, 0, 0};
  CommOp a2a{.kind = CommOp::Kind::alltoallv,
             .in = data,
             .out = data,
             .send_counts = counts,
             .send_displs = displs,
             .recv_counts = counts,
             .recv_displs = displs,
             .elem_bytes = 4};
  b = op_buffers(a2a, 3);
  REQUIRE(b.size() == 2);
  CHECK(b[0].bytes == 24);                 // displacement 4 + count 2 elements
  CHECK(op_buffers(CommOp{}, 4).empty());  // a barrier has none
}
