// `trident run CONFIG.toml [--set k=v ...] [--output FILE.h5] [--resume [CKPT]]`:
// the training job. Parses the command line and the config, checks every
// layer's rules against the world, maps the mesh, and hands over to
// train::run (resume, run file, steps, checkpoints, stop signals, summary).
#include "trident/train/run.hpp"

#include <cstdio>
#include <optional>

#include "commands.hpp"
#include "trident/comm/flight_recorder.hpp"
#include "trident/comm/process.hpp"
#include "trident/kernels/blas.hpp"
#include "trident/model/data.hpp"
#include "trident/plan/predict.hpp"
#include "trident/topo/topology.hpp"
#include "trident/train/check_config.hpp"

namespace trident::cli {
namespace {

class RunCommand : public Command {
 public:
  explicit RunCommand(CLI::App* app) {
    app->add_option("config", config_, "Config file (TOML)")->required();
    app->add_option("--set", sets_, "Override a config key: section.key=value (repeatable)");
    app->add_option("--output", output_, "Run file (HDF5); default output.file");
    resume_opt_ = app->add_option("--resume", resume_,
                                  "Resume from CKPT, or from the latest checkpoint in "
                                  "output.checkpoint_dir when no file is given")
                      ->expected(0, 1);
    app->add_option("--machine", machine_,
                    "Machine profile (TOML): record the planner's prediction of this mesh in the "
                    "run file (trident-analyze predicted compares)");
  }
  bool needs_mpi() const override { return true; }
  int run() override;

 private:
  std::string config_, output_, resume_, machine_;
  std::vector<std::string> sets_;
  CLI::Option* resume_opt_ = nullptr;
};

int RunCommand::run() {
  const int world_size = comm_world_size();
  // one BLAS thread per rank: the ranks already share the cores
  kernels::set_blas_threads(1);
  // TRIDENT_CPU_BF16 read now: a bad value is one line and exit 2 before any output
  const std::string bf16_kernels = kernels::cpu_bf16_kernels();
  // and TRIDENT_CPU_GEMM_BLOCKS (the fp32 GEMMs' parameters), the same way
  (void)kernels::cpu_gemm_params();

  Config cfg = load_config(config_, sets_);
  if (!output_.empty()) cfg.output.file = output_;
  train::check_config(cfg, world_size);
  flight_configure(cfg.runtime.flight_records);
  std::optional<plan::MachineProfile> machine;
  if (!machine_.empty())
    machine = plan::load_machine(machine_);  // bad file: exit 2 before any output
  auto job = world_communicator(cfg.runtime.timeout_s);
  Topology topo = detect_topology(*job, cfg);
  auto comms = build_communicators(*job, cfg, std::move(topo));
  // named only where the rank's kernels run on the host CPU (not under
  // runtime.backend = "automatic" that chose a GPU)
  if (cfg.train.precision == Precision::bf16 && comms->device.is_cpu() && comm_world_rank() == 0)
    std::printf("cpu bf16 GEMMs: %s\n", bf16_kernels.c_str());
  sync_clock(*job);

  train::RunRequest request;
  request.config_path = config_;
  request.resume = resume_opt_->count() > 0;
  request.resume_from = resume_;
  request.command_line = command_line();
  if (machine) {
    // Packed documents: attention priced from the data's length histogram,
    // as `trident plan` prices it (plan/packed_attention.hpp).
    Config priced = cfg;
    if (cfg.data.packing == Packing::documents && cfg.data.task == DataTask::tokens)
      priced.doc_lengths_log2 = model::make_data_source(cfg, 1)->document_lengths_log2();
    request.prediction_json = plan::prediction_json(
        plan::predict(priced, plan::mesh_plan_of(cfg, world_size), comms->topo.shape, *machine));
  }
  return train::run(cfg, *comms, request);
}

}  // namespace

std::unique_ptr<Command> add_run_command(CLI::App& parent) {
  auto* app = parent.add_subcommand("run", "Train the model of CONFIG.toml (under mpirun/srun)");
  return std::make_unique<RunCommand>(app);
}

}  // namespace trident::cli
