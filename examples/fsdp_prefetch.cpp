// fsdp_prefetch: fully sharded data parallel training (seed 001's FSDP) on dtensor plans, with
// the next layers' all-gathers prefetched while the current layer computes.
//
// Every layer's parameters, a weight W_l [dim, dim] and a bias b_l [dim], live as Shard(0) over
// all ranks of a 1-D mesh "fsdp"; each rank trains on its own micro-batch. Per step:
//   forward   for each layer: all-gather W_l and b_l (S(0) -> R, one batch: one all-gather for
//             both), h = tanh(h·W_l + b_l), drop the full parameters;
//   backward  for each layer, last first: all-gather them again, dW_l = hᵀ·dz and db_l = the
//             column sums of dz (this rank's parts of the gradients: Partial(avg) over ranks),
//             reduce-scatter both (P(avg) -> S(0), one batch), dh = dz·W_lᵀ;
//   update    each shard -= lr · its gradient shard.
// The batches run through execute_async on one MpiBackend (the all-gathers) and a second (the
// reduce-scatters; two queues, as FSDP uses two streams), and the layer's compute polls both
// between row blocks so that MPI makes progress meanwhile. With prefetch depth d, the
// all-gathers of the next d layers (in the order the pass needs them) are in flight while a
// layer computes: more overlap, d more unsharded layers in memory. The seed's own trade-off.
//
// The program trains with depth 0, 1 and 2, checks the loss and every weight shard after each
// step against the same model trained in one process on the whole batch, checks that every
// depth gives the same bits, and prints step time and the peak of unsharded weight memory per
// depth. Exits 1 when anything differs.
//
//   mpirun -np 4 build/<dir>/examples/example_fsdp_prefetch [--dim 256] [--layers 6]
//          [--batch 16] [--steps 3]
#include <dtensor/backend/mpi.hpp>
#include <dtensor/dtensor.hpp>
#include <dtensor/execute.hpp>
#include <dtensor/execute_batch.hpp>

#include <fmt/core.h>
#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace dtensor;
using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<Matrix>;
using ConstMap = Eigen::Map<const Matrix>;
using ConstRow = Eigen::Map<const Eigen::RowVectorXf>;

struct Options {
  int dim = 256, layers = 6, batch = 16, steps = 3;
  float lr = 0.5f;
};

// Bytes of unsharded parameters alive at once: what prefetching costs.
struct MemoryMeter {
  std::int64_t now = 0, peak = 0;
  void add(std::int64_t b) { peak = std::max(peak, now += b); }
  void remove(std::int64_t b) { now -= b; }
};

// The plans of one layer's parameters, weight then bias: gathered together for compute, their
// gradients reduce-scattered together (a batch of two tensors: one collective each way).
struct LayerPlans {
  Layout weight, bias;  // sharded
  BatchPlan<2> gather;  // S(0) -> R: one all-gather round
  BatchPlan<2> reduce;  // P(avg) -> S(0): one reduce-scatter round of the ranks' gradients
  LayerPlans(const DeviceMesh& mesh, int dim)
      : weight(mesh, {Shard(0)}, {dim, dim}, DType::f32),
        bias(mesh, {Shard(0)}, {dim}, DType::f32),
        gather(plan_batch<2>(
            std::vector<Redistribution>{{weight, weight.with_placements({Replicate()})},
                                        {bias, bias.with_placements({Replicate()})}})),
        reduce(plan_batch<2>(
            std::vector<Redistribution>{{weight.with_placements({Partial(ReduceOp::avg)}), weight},
                                        {bias.with_placements({Partial(ReduceOp::avg)}), bias}})) {}
};

// A layer's parameters, or their gradients: weight then bias, as the batches order them.
struct Params {
  std::vector<float> weight, bias;
  // The batch's buffers from these (source) into `to` (target).
  [[nodiscard]] std::vector<TensorBuffers> into(Params& to) const {
    return {
        {weight.data(), weight.size() * sizeof(float), to.weight.data(),
         to.weight.size() * sizeof(float)},
        {bias.data(), bias.size() * sizeof(float), to.bias.data(), to.bias.size() * sizeof(float)}};
  }
  bool operator==(const Params&) const = default;
};

// The all-gathers of full parameters, started up to `depth` layers ahead of the one computing.
class Prefetcher {
 public:
  Prefetcher(MpiBackend& backend, const LayerPlans& plans, const std::vector<Params>& shards,
             int depth, MemoryMeter& memory)
      : backend_(backend), plans_(plans), shards_(shards), depth_(depth), memory_(memory) {}

  // The full parameters of layer order[i], once gathered; first starts the all-gathers of the
  // next `depth` layers of `order`, so that they move while this one computes.
  const Params& get(const std::vector<int>& order, std::size_t i) {
    for (std::size_t k = i; k <= i + static_cast<std::size_t>(depth_) && k < order.size(); ++k)
      start(order[k]);
    Slot& s = slots_.at(order[i]);
    if (s.running) {
      s.running->wait();
      s.running.reset();
    }
    return s.full;
  }
  // Drops layer l's full parameters (FSDP reshards after use).
  void release(int l) {
    memory_.remove(bytes());
    slots_.erase(l);
  }
  // Lets the all-gathers in flight progress.
  void poll() {
    for (auto& [layer, s] : slots_)
      if (s.running) s.running->test();
  }

 private:
  struct Slot {
    Params full;
    std::optional<Execution<MpiBackend>> running;
  };
  [[nodiscard]] std::int64_t bytes() const {
    return (plans_.gather[0].dst().local_numel(0) + plans_.gather[1].dst().local_numel(0)) * 4;
  }

  void start(int l) {
    if (slots_.contains(l)) return;
    Slot& s = slots_[l];  // a map's node stays where it is: the batch's targets do too
    s.full.weight.resize(static_cast<std::size_t>(plans_.gather[0].dst().local_numel(0)));
    s.full.bias.resize(static_cast<std::size_t>(plans_.gather[1].dst().local_numel(0)));
    memory_.add(bytes());
    const std::vector<TensorBuffers> buffers = shards_[static_cast<std::size_t>(l)].into(s.full);
    s.running.emplace(
        execute_async(plans_.gather, backend_, std::span<const TensorBuffers>(buffers)));
  }

  MpiBackend& backend_;
  const LayerPlans& plans_;
  const std::vector<Params>& shards_;
  int depth_;
  MemoryMeter& memory_;
  std::map<int, Slot> slots_;
};

// out = a·b computed in row blocks, calling `progress` between blocks.
template <class F>
void matmul_polling(const Matrix& a, const ConstMap& b, Matrix& out, F&& progress) {
  out.resize(a.rows(), b.cols());
  const Eigen::Index block = 8;
  for (Eigen::Index r = 0; r < a.rows(); r += block) {
    const Eigen::Index n = std::min(block, a.rows() - r);
    out.middleRows(r, n).noalias() = a.middleRows(r, n) * b;
    progress();
  }
}

// Deterministic data: every rank can build the whole batch and take its rows.
Matrix random_matrix(int rows, int cols, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  Matrix m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = u(rng);
  return m;
}

struct Result {
  std::vector<float> losses;
  std::vector<Params> shards;  // after the last step
  double step_seconds = 0;     // median over steps
  std::int64_t peak_unsharded_bytes = 0;
};

// Layer l's initial parameters, whole.
Matrix initial_weight(const Options& o, int l) {
  return random_matrix(o.dim, o.dim, 100u + static_cast<unsigned>(l),
                       1.5f / std::sqrt(static_cast<float>(o.dim)));
}
Matrix initial_bias(const Options& o, int l) {
  return random_matrix(1, o.dim, 300u + static_cast<unsigned>(l), 0.1f);
}

// This rank's shard of a layer's parameters, whole in `weight` and `bias`.
Params shard_of(const LayerPlans& plans, int rank, const Matrix& weight, const Matrix& bias) {
  const Box w = plans.weight.local_box(rank), b = plans.bias.local_box(rank);
  const Matrix rows = weight.middleRows(w.offset[0], w.shape[0]);
  const Matrix part = bias.middleCols(b.offset[0], b.shape[0]);
  return {std::vector<float>(rows.data(), rows.data() + rows.size()),
          std::vector<float>(part.data(), part.data() + part.size())};
}

// Trains with FSDP on this rank's micro-batch, prefetching `depth` layers ahead.
Result train_fsdp(const Options& o, const DeviceMesh& mesh, MpiBackend& gather_backend,
                  MpiBackend& reduce_backend, int depth) {
  const int rank = gather_backend.rank(), ranks = mesh.size();
  const LayerPlans plans(mesh, o.dim);
  std::vector<Params> shards;
  for (int l = 0; l < o.layers; ++l)
    shards.push_back(shard_of(plans, rank, initial_weight(o, l), initial_bias(o, l)));
  MemoryMeter memory;
  Result result;
  std::vector<double> seconds;
  std::vector<int> forward_order(static_cast<std::size_t>(o.layers));
  for (int l = 0; l < o.layers; ++l) forward_order[static_cast<std::size_t>(l)] = l;
  const std::vector<int> backward_order(forward_order.rbegin(), forward_order.rend());
  // The step's loss: each rank's mean, averaged over ranks by a plan (P(avg) -> R).
  const Layout loss_layout(mesh, {Partial(ReduceOp::avg)}, {1}, DType::f32);
  const Plan average = plan_redistribute(loss_layout, loss_layout.with_placements({Replicate()}));

  for (int step = 0; step < o.steps; ++step) {
    const Matrix x_all =
        random_matrix(o.batch * ranks, o.dim, 1000u + static_cast<unsigned>(step), 1.0f);
    const Matrix t_all =
        random_matrix(o.batch * ranks, o.dim, 2000u + static_cast<unsigned>(step), 0.5f);
    const Matrix x = x_all.middleRows(static_cast<Eigen::Index>(rank) * o.batch, o.batch);
    const Matrix t = t_all.middleRows(static_cast<Eigen::Index>(rank) * o.batch, o.batch);
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();

    Prefetcher params(gather_backend, plans, shards, depth, memory);
    std::vector<Params> grad_shards(shards.size()), grad_full(shards.size());
    std::vector<Execution<MpiBackend>> reducing;
    auto progress = [&] {
      params.poll();
      for (auto& e : reducing) e.test();
    };

    // Forward: keep each layer's input and output for the backward.
    std::vector<Matrix> h(static_cast<std::size_t>(o.layers) + 1);
    h[0] = x;
    for (std::size_t i = 0; i < forward_order.size(); ++i) {
      const int l = forward_order[i];
      const Params& full = params.get(forward_order, i);
      Matrix z;
      matmul_polling(h[static_cast<std::size_t>(l)], ConstMap(full.weight.data(), o.dim, o.dim), z,
                     progress);
      z.rowwise() += ConstRow(full.bias.data(), o.dim);
      h[static_cast<std::size_t>(l) + 1] = z.array().tanh().matrix();
      params.release(l);
    }
    const Matrix& y = h.back();
    const float n = static_cast<float>(y.size());
    std::vector<float> loss{(y - t).squaredNorm() / n}, mean_loss(1);
    Matrix dh = 2.0f * (y - t) / n;

    // Backward, last layer first: gradients reduce-scattered as soon as they are computed.
    for (std::size_t i = 0; i < backward_order.size(); ++i) {
      const int l = backward_order[i];
      const auto u = static_cast<std::size_t>(l);
      const ConstMap w(params.get(backward_order, i).weight.data(), o.dim, o.dim);
      const Matrix dz = (dh.array() * (1.0f - h[u + 1].array().square())).matrix();
      Params& grad = grad_full[u];
      grad.weight.resize(static_cast<std::size_t>(o.dim) * static_cast<std::size_t>(o.dim));
      MatrixMap(grad.weight.data(), o.dim, o.dim).noalias() = h[u].transpose() * dz;
      grad.bias.resize(static_cast<std::size_t>(o.dim));
      Eigen::Map<Eigen::RowVectorXf>(grad.bias.data(), o.dim) = dz.colwise().sum();
      grad_shards[u].weight.resize(shards[u].weight.size());
      grad_shards[u].bias.resize(shards[u].bias.size());
      const std::vector<TensorBuffers> buffers = grad.into(grad_shards[u]);
      reducing.push_back(
          execute_async(plans.reduce, reduce_backend, std::span<const TensorBuffers>(buffers)));
      if (l > 0) {
        const Matrix w_t = w.transpose();
        matmul_polling(dz, ConstMap(w_t.data(), o.dim, o.dim), dh, progress);
      }
      params.release(l);
    }
    for (auto& e : reducing) e.wait();
    for (std::size_t l = 0; l < shards.size(); ++l) {
      for (std::size_t k = 0; k < shards[l].weight.size(); ++k)
        shards[l].weight[k] -= o.lr * grad_shards[l].weight[k];
      for (std::size_t k = 0; k < shards[l].bias.size(); ++k)
        shards[l].bias[k] -= o.lr * grad_shards[l].bias[k];
    }
    seconds.push_back(MPI_Wtime() - start);

    execute(average, gather_backend, std::span<const float>(loss), std::span<float>(mean_loss));
    result.losses.push_back(mean_loss[0]);
  }
  std::sort(seconds.begin(), seconds.end());
  result.step_seconds = seconds[seconds.size() / 2];
  result.shards = shards;
  result.peak_unsharded_bytes = memory.peak;
  return result;
}

// The same training in one process on the whole batch: the reference.
Result train_single(const Options& o, int ranks, int rank, const LayerPlans& plans) {
  std::vector<Matrix> w, b;
  for (int l = 0; l < o.layers; ++l) {
    w.push_back(initial_weight(o, l));
    b.push_back(initial_bias(o, l));
  }
  Result result;
  for (int step = 0; step < o.steps; ++step) {
    const Matrix x =
        random_matrix(o.batch * ranks, o.dim, 1000u + static_cast<unsigned>(step), 1.0f);
    const Matrix t =
        random_matrix(o.batch * ranks, o.dim, 2000u + static_cast<unsigned>(step), 0.5f);
    std::vector<Matrix> h{x};
    for (std::size_t l = 0; l < w.size(); ++l) {
      Matrix z = h.back() * w[l];
      z.rowwise() += b[l].row(0);
      h.push_back(z.array().tanh().matrix());
    }
    const float n = static_cast<float>(h.back().size());
    result.losses.push_back((h.back() - t).squaredNorm() / n);
    Matrix dh = 2.0f * (h.back() - t) / n;
    std::vector<Matrix> grads(w.size()), bias_grads(w.size());
    for (std::size_t l = w.size(); l-- > 0;) {
      const Matrix dz = (dh.array() * (1.0f - h[l + 1].array().square())).matrix();
      grads[l] = h[l].transpose() * dz;
      bias_grads[l] = dz.colwise().sum();
      dh = dz * w[l].transpose();
    }
    for (std::size_t l = 0; l < w.size(); ++l) {
      w[l] -= o.lr * grads[l];
      b[l] -= o.lr * bias_grads[l];
    }
  }
  for (std::size_t l = 0; l < w.size(); ++l)
    result.shards.push_back(shard_of(plans, rank, w[l], b[l]));
  return result;
}

// The largest difference relative to the reference's magnitude.
double max_relative_error(std::span<const float> got, std::span<const float> want) {
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::abs(double(got[i]) - double(want[i])) /
                                std::max(1.0, std::abs(double(want[i]))));
  return worst;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (value <= 0)
      throw error(fmt::format("{} needs a positive number, got '{}'", flag, argv[i + 1]));
    if (flag == "--dim")
      o.dim = value;
    else if (flag == "--layers")
      o.layers = value;
    else if (flag == "--batch")
      o.batch = value;
    else if (flag == "--steps")
      o.steps = value;
    else
      throw error(fmt::format("unknown option {}", flag));
  }
  return o;
}

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  int rank = 0, ranks = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const DeviceMesh mesh({ranks}, {"fsdp"});
  MpiBackend gather_backend(mesh), reduce_backend(mesh);
  const LayerPlans plans(mesh, o.dim);
  if (rank == 0)
    fmt::print(
        "FSDP on {} ranks: {} layers of [{}, {}] f32 weights and [{}] biases, S(0) over \"fsdp\"; "
        "micro-batch {} per rank, {} steps\n  gather: {}\n  reduce: {}\n",
        ranks, o.layers, o.dim, o.dim, o.dim, o.batch, o.steps, explain(plans.gather),
        explain(plans.reduce));
  const Result reference = train_single(o, ranks, rank, plans);
  bool ok = true;
  std::optional<Result> depth_zero;
  if (rank == 0)
    fmt::print("  {:>5}  {:>12}  {:>24}  {:>20}\n", "depth", "step time", "peak unsharded params",
               "max relative error");
  for (int depth : {0, 1, 2}) {
    const Result r = train_fsdp(o, mesh, gather_backend, reduce_backend, depth);
    double worst = max_relative_error(r.losses, reference.losses);
    for (std::size_t l = 0; l < r.shards.size(); ++l) {
      worst = std::max(worst, max_relative_error(r.shards[l].weight, reference.shards[l].weight));
      worst = std::max(worst, max_relative_error(r.shards[l].bias, reference.shards[l].bias));
    }
    bool good = worst <= 1e-4;
    // Prefetching changes when bytes move, never which: every depth gives the same bits.
    if (depth_zero)
      good = good && r.losses == depth_zero->losses && r.shards == depth_zero->shards;
    else
      depth_zero = r;
    int bad = good ? 0 : 1, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    double slowest = 0;
    MPI_Allreduce(&r.step_seconds, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0)
      fmt::print(
          "  {:>5}  {:>9.2f} ms  {:>17.2f} MiB ({})  {:>20.2e}{}\n", depth, slowest * 1e3,
          double(r.peak_unsharded_bytes) / (1 << 20),
          r.peak_unsharded_bytes /
              ((plans.gather[0].dst().local_numel(0) + plans.gather[1].dst().local_numel(0)) * 4),
          worst, any ? "  DIFFERS" : "");
    if (rank == 0 && depth == 0)
      fmt::print("  losses: {:.6f} ... {:.6f} (single process {:.6f} ... {:.6f})\n",
                 r.losses.front(), r.losses.back(), reference.losses.front(),
                 reference.losses.back());
    ok = ok && any == 0;
  }
  if (rank == 0) fmt::print("fsdp_prefetch: {}\n", ok ? "verified" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int code = 0;
  try {
    code = run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "fsdp_prefetch: {}\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return code;
}
