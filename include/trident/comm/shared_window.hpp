// SharedWindow: one block of shared memory per rank of a communicator whose
// ranks all share a node (an MPI shared-memory window of its host group), every block mapped into
// every rank's address space, so peers read and write it with plain loads
// and stores.
//
// Why: between processes of one node, MPI moves a message with one copy
// (UCX reads the peer's buffer through the kernel, which pins its pages),
// and the caller packs before and unpacks after. Writing rows straight into
// the peer's block, or reading them straight out of it, makes the packing
// part of the one copy, at memcpy speed. Ordering is the caller's: write,
// fence(), read, fence() (see ep::TokenDispatcher).
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "trident/comm/comm.hpp"

namespace trident {

class SharedWindow {
 public:
  // Collective over comm: this rank's block of `bytes` bytes (may be 0).
  SharedWindow(Communicator& comm, size_t bytes);
  // Collective (frees the window), except while an exception unwinds: then the
  // window is left to the process exit rather than block on peers that may
  // never come.
  ~SharedWindow();
  SharedWindow(const SharedWindow&) = delete;
  SharedWindow& operator=(const SharedWindow&) = delete;

  // Rank r's block as this process sees it, and its size in bytes.
  char* block(int r) const { return base_[size_t(r)]; }
  size_t block_bytes(int r) const { return bytes_[size_t(r)]; }

  // Everybody's stores so far are visible to everybody afterwards: a memory
  // barrier (a window sync) on both sides of a barrier of comm, which waits
  // with comm's deadline.
  void fence();

  // Whether every rank of comm shares this node (collective). Otherwise
  // *why_not names a rank that does not.
  static bool node_local(Communicator& comm, std::string* why_not);
  // Free bytes where Open MPI places the blocks (/dev/shm).
  static double free_bytes();

 private:
  struct Window;  // the MPI window, kept out of this header
  Communicator& comm_;
  std::unique_ptr<Window> win_;
  std::vector<char*> base_;
  std::vector<size_t> bytes_;
};

}  // namespace trident
