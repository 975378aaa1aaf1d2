// MpiCommunicator: the Communicator over MPI (Open MPI over UCX), for host
// buffers. Every operation is posted non-blocking (MPI_Isend, MPI_Iallreduce,
// ...) and its MPI request is the PendingOp that the common watchdog polls.
// Device buffers (stage_device_buffers) go through host copies.
//
// The only header outside src/comm that includes mpi.h, and only for code
// that must hand an MPI communicator to another library: parallel HDF5's
// MPI-IO file driver (io's run file) and tests that build communicators from
// MPI_COMM_WORLD. Everything else uses Communicator.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>

#include "trident/comm/comm.hpp"

namespace trident {

class MpiCommunicator final : public Communicator {
 public:
  // Wraps comm (frees it at destruction if owned) and duplicates it once for
  // the messages of rank-ordered sums (SumOrder::rank), which then never
  // meet the point-to-point traffic of comm's users.
  MpiCommunicator(MPI_Comm comm, CommKind kind, std::string name, double timeout_s, bool owned);
  ~MpiCommunicator() override;

  MPI_Comm native() const { return comm_; }

  const char* backend_name() const override { return "mpi"; }
  Device device() const override { return Device::cpu(); }
  int max_tag() const override;
  Communicator& host() override { return *this; }
  std::unique_ptr<Communicator> split(int color, int key, CommKind kind, std::string name) override;
  std::unique_ptr<Communicator> split_node(CommKind kind, std::string name) override;
  void stage_device_buffers(std::shared_ptr<DeviceStaging> staging) override {
    staging_ = std::move(staging);
  }

 protected:
  std::unique_ptr<PendingOp> post(const CommOp& op) override;
  size_t max_elements_per_reduction() const override;

 private:
  std::unique_ptr<PendingOp> post_host(const CommOp& op);  // host buffers as given

  MPI_Comm comm_;
  MPI_Comm ordered_ = MPI_COMM_NULL;  // a duplicate of comm_ for rank-ordered sums
  uint64_t ordered_posted_ = 0;       // rank-ordered sums so far: their tags
  bool owned_;
  std::shared_ptr<DeviceStaging> staging_;  // null: host buffers only
};

// The MPI handles under a communicator (its host() group), for the one
// library that must be handed them: parallel HDF5 (H5Pset_fapl_mpio takes
// an MPI_Comm and an MPI_Info). Throws Error if the host communicator is not
// an MpiCommunicator.
struct MpiHandles {
  MPI_Comm comm;
  MPI_Info info;
};
MpiHandles mpi_handles(const Communicator& c);

}  // namespace trident
