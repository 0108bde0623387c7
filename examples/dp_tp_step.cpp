// dp_tp_step: SGD steps of a data x tensor parallel model on a 2x4 mesh {"dp", "tp"}, every
// communication a dtensor plan (seed 003's TP + DDP composition, seed 000's extra reduction of
// parameters shared across tensor-parallel ranks).
//
//   out = (tanh(x·W1)·W2) ⊙ gain + bias,   loss = mean over rows of |out - target|² / 2
//
// W1 [hidden, ffn] is column-parallel and W2 [ffn, hidden] row-parallel: (Replicate, Shard) on
// (dp, tp). Each dp replica gets its own micro-batch (x is (Shard(0), Replicate)). The
// row-parallel output is reduce-scattered over the rows (Megatron's sequence parallelism), so
// gain and bias, replicated on both mesh dims like a layer norm's, meet only their tp rank's
// rows: their gradients are Partial on tp as well as on dp and need the extra all-reduce that
// seed 000 asks for with `mark_for_reduction`. Here that is simply part of the gradient's
// layout, and one plan does both reductions. The other parameters' gradients are Partial(avg)
// on dp, as in DDP (why avg: see ParallelModel), and one all-reduce plan each makes them
// Replicate.
//
// Every rank also runs the same model in one process on the whole batch; loss and parameters
// must agree after every step. Exits 1 when they differ, printing what.
//
//   mpirun -np 8 build/<dir>/examples/example_dp_tp_step
//   ctest --test-dir build/<dir> -R example_dp_tp_step
#include <dtensor/backend/mpi.hpp>
#include <dtensor/dtensor.hpp>
#include <dtensor/execute.hpp>

#include <fmt/core.h>
#include <Eigen/Dense>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <random>
#include <span>
#include <string>
#include <string_view>

namespace {

using namespace dtensor;

// Row-major, like dtensor's local blocks, so a Matrix's storage is a block.
using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

constexpr int dp_size = 2, tp_size = 4;
constexpr std::int64_t batch = 16, hidden = 8, ffn = 16;  // batch: the whole batch, all replicas
constexpr int steps_to_run = 4;
constexpr double learning_rate = 0.5;
// Sums run in a different order on the parallel path: equal to rounding, not bit for bit.
constexpr double tolerance = 1e-12;

Matrix random_matrix(std::mt19937& gen, std::int64_t rows, std::int64_t cols) {
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  Matrix m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = uniform(gen);
  return m;
}

// This rank's block of a global (not Partial) tensor.
Matrix block_of(const Layout& layout, int rank, const Matrix& global) {
  const Box box = layout.local_box(rank);
  return global.block(box.offset[0], box.offset[1], box.shape[0], box.shape[1]);
}

// Runs `plan` on this rank's block of plan.src() and returns its block of plan.dst(). Every
// communication of the parallel model goes through here.
Matrix redistribute(const Plan& plan, MpiBackend& backend, const Matrix& block) {
  const Shape shape = plan.dst().local_shape(backend.rank());
  Matrix out(shape[0], shape[1]);
  execute(plan, backend,
          std::span<const double>(block.data(), static_cast<std::size_t>(block.size())),
          std::span<double>(out.data(), static_cast<std::size_t>(out.size())));
  return out;
}

// "all_reduce on dp + all_reduce on tp", or "nothing".
std::string steps(const Plan& plan) {
  const DeviceMesh& mesh = plan.src().mesh();
  std::string out;
  for (const Step& s : plan)
    out += fmt::format("{}{} on {}", out.empty() ? "" : " + ", name(s.kind),
                       s.mesh_dim < 0 ? "the mesh" : mesh.name(s.mesh_dim));
  return out.empty() ? "nothing" : out;
}

// The model's parameters: whole matrices for the reference, this rank's blocks when parallel.
struct Params {
  Matrix w1, w2, gain, bias;  // gain and bias are 1 x hidden rows
};

struct Batch {
  Matrix x, target;
};

Params initial_params() {
  std::mt19937 gen(7);
  return {random_matrix(gen, hidden, ffn), random_matrix(gen, ffn, hidden),
          random_matrix(gen, 1, hidden), random_matrix(gen, 1, hidden)};
}

// Step s's batch: the same on every rank, which keeps its micro-batch.
Batch batch_for_step(int s) {
  std::mt19937 gen(1000 + static_cast<unsigned>(s));
  return {random_matrix(gen, batch, hidden), random_matrix(gen, batch, hidden)};  // x, target
}

Matrix tanh_of(const Matrix& m) { return m.array().tanh().matrix(); }

// One SGD step in one process on the whole batch; returns the loss before the update.
double reference_step(Params& p, const Batch& b) {
  const Matrix z = tanh_of(b.x * p.w1);
  const Matrix y = z * p.w2;
  const Matrix out =
      (y.array().rowwise() * p.gain.row(0).array()).rowwise() + p.bias.row(0).array();
  const Matrix diff = out - b.target;
  const double rows = static_cast<double>(b.x.rows());
  const double loss = diff.squaredNorm() / (2 * rows);

  const Matrix d_out = diff / rows;
  const Matrix d_gain = (d_out.array() * y.array()).colwise().sum();
  const Matrix d_bias = d_out.colwise().sum();
  const Matrix dy = d_out.array().rowwise() * p.gain.row(0).array();
  const Matrix dz = (dy * p.w2.transpose()).cwiseProduct((1 - z.array().square()).matrix());
  const Matrix d_w2 = z.transpose() * dy;
  const Matrix d_w1 = b.x.transpose() * dz;

  p.w1 -= learning_rate * d_w1;
  p.w2 -= learning_rate * d_w2;
  p.gain -= learning_rate * d_gain;
  p.bias -= learning_rate * d_bias;
  return loss;
}

// The same model on the dp x tp mesh: layouts, the plans between them, this rank's blocks.
class ParallelModel {
 public:
  ParallelModel(const DeviceMesh& mesh, MpiBackend& backend, const Params& whole)
      : backend_(backend),
        x_(mesh, {Shard(0), Replicate()}, {batch, hidden}, DType::f64),
        rows_(mesh, {Shard(0), Shard(0)}, {batch, hidden}, DType::f64),
        y_partial_(mesh, {Shard(0), Partial()}, {batch, hidden}, DType::f64),
        w1_(mesh, {Replicate(), Shard(1)}, {hidden, ffn}, DType::f64),
        w2_(mesh, {Replicate(), Shard(0)}, {ffn, hidden}, DType::f64),
        shared_(mesh, {Replicate(), Replicate()}, {1, hidden}, DType::f64),
        // Each rank's share of the loss: reduced like the gradients below.
        loss_(mesh, {Partial(ReduceOp::avg), Partial()}, {1, 1}, DType::f64),
        // Forward: the row-parallel output's partial sums become this rank's rows of the sum.
        reduce_scatter_(plan_redistribute(y_partial_, rows_)),
        // Backward: the gradient arrives as (S(0), S(0)) and is all-gathered over tp.
        reduce_scatter_backward_(plan_backward(y_partial_, rows_)),
        loss_reduce_(plan_redistribute(loss_, loss_.with_placements({Replicate(), Replicate()}))),
        // Each replica, like a DDP replica, divides its loss by its own micro-batch, so the
        // whole batch's gradient is the *average* over dp of the replicas' gradients (seed 003
        // all-reduces with ReduceOp.AVG for the same reason; it takes micro-batches of equal
        // size).
        w1_grad_(plan_redistribute(w1_.with_placements({Partial(ReduceOp::avg), Shard(1)}), w1_)),
        w2_grad_(plan_redistribute(w2_.with_placements({Partial(ReduceOp::avg), Shard(0)}), w2_)),
        // Gain and bias: each tp rank's rows are a disjoint part of its replica's sum, so their
        // gradients are Partial(sum) on tp as well: mark_for_reduction's extra all-reduce.
        shared_grad_(plan_redistribute(shared_.with_placements({Partial(ReduceOp::avg), Partial()}),
                                       shared_)) {
    p_ = blocks_of(whole);
  }

  // One SGD step on this rank's share of the batch; returns the loss (of the whole batch)
  // before the update.
  double step(const Batch& whole) {
    const int rank = backend_.rank();
    const Matrix x = block_of(x_, rank, whole.x);               // this replica's micro-batch
    const Matrix target = block_of(rows_, rank, whole.target);  // this rank's rows of it

    // Forward. Column-parallel, row-parallel, then to the sequence-parallel region.
    const Matrix z = tanh_of(x * p_.w1);
    const Matrix y = redistribute(reduce_scatter_, backend_, z * p_.w2);
    const Matrix out =
        (y.array().rowwise() * p_.gain.row(0).array()).rowwise() + p_.bias.row(0).array();
    const Matrix diff = out - target;
    const double micro_batch = static_cast<double>(x.rows());
    Matrix loss(1, 1);
    loss(0, 0) = diff.squaredNorm() / (2 * micro_batch);  // this rank's rows' share

    // Backward. Gradients of gain and bias from this rank's rows only: Partial on tp too.
    const Matrix d_out = diff / micro_batch;
    const Matrix d_gain = (d_out.array() * y.array()).colwise().sum();
    const Matrix d_bias = d_out.colwise().sum();
    const Matrix d_y_rows = d_out.array().rowwise() * p_.gain.row(0).array();
    const Matrix dy = redistribute(reduce_scatter_backward_, backend_, d_y_rows);  // all rows
    const Matrix dz = (dy * p_.w2.transpose()).cwiseProduct((1 - z.array().square()).matrix());
    const Matrix d_w2 = z.transpose() * dy;
    const Matrix d_w1 = x.transpose() * dz;

    // Gradient synchronization (DDP's all-reduce, and seed 000's extra one for gain and bias).
    p_.w1 -= learning_rate * redistribute(w1_grad_, backend_, d_w1);
    p_.w2 -= learning_rate * redistribute(w2_grad_, backend_, d_w2);
    p_.gain -= learning_rate * redistribute(shared_grad_, backend_, d_gain);
    p_.bias -= learning_rate * redistribute(shared_grad_, backend_, d_bias);
    return redistribute(loss_reduce_, backend_, loss)(0, 0);
  }

  [[nodiscard]] const Params& params() const { return p_; }
  // This rank's blocks of whole parameters.
  [[nodiscard]] Params blocks_of(const Params& whole) const {
    const int rank = backend_.rank();
    return {block_of(w1_, rank, whole.w1), block_of(w2_, rank, whole.w2),
            block_of(shared_, rank, whole.gain), block_of(shared_, rank, whole.bias)};
  }

  void print_plans() const {
    const auto line = [](std::string_view what, const Plan& plan) {
      fmt::print("  {:<34} {} -> {}: {}\n", what, plan.src().placements(), plan.dst().placements(),
                 steps(plan));
    };
    fmt::print("layouts on {}: x {}, W1 {}, W2 {}, gain and bias {}\n", x_.mesh(), x_.placements(),
               w1_.placements(), w2_.placements(), shared_.placements());
    line("row-parallel output", reduce_scatter_);
    line("its gradient", reduce_scatter_backward_);
    line("W1 gradient", w1_grad_);
    line("W2 gradient", w2_grad_);
    line("gain and bias gradients", shared_grad_);
    line("loss", loss_reduce_);
  }

 private:
  MpiBackend& backend_;
  Layout x_, rows_, y_partial_, w1_, w2_, shared_, loss_;
  Plan reduce_scatter_, reduce_scatter_backward_, loss_reduce_, w1_grad_, w2_grad_, shared_grad_;
  Params p_;
};

// Compares this rank's loss and parameters after step `s` with the single-process run's and
// prints what differs; `worst` gets the largest relative error.
bool matches_reference(int rank, int s, double loss, double want_loss, const Params& got,
                       const Params& want, double& worst) {
  bool ok = true;
  const auto compare = [&](std::string_view what, const Matrix& a, const Matrix& b) {
    const double scale = std::max(1.0, b.cwiseAbs().maxCoeff());
    const double error = (a - b).cwiseAbs().maxCoeff() / scale;
    worst = std::max(worst, error);
    if (error <= tolerance) return;
    ok = false;
    fmt::print(stderr,
               "rank {}: step {}: {} differs from the single-process run: max relative error "
               "{:.3g}\n",
               rank, s, what, error);
  };
  compare("loss", Matrix::Constant(1, 1, loss), Matrix::Constant(1, 1, want_loss));
  compare("W1 (this rank's columns)", got.w1, want.w1);
  compare("W2 (this rank's rows)", got.w2, want.w2);
  compare("gain", got.gain, want.gain);
  compare("bias", got.bias, want.bias);
  return ok;
}

bool run() {
  const DeviceMesh mesh({dp_size, tp_size}, {"dp", "tp"});
  MpiBackend backend(mesh);
  const int rank = backend.rank();

  Params reference = initial_params();
  ParallelModel model(mesh, backend, reference);
  if (rank == 0) model.print_plans();

  bool passed = true;
  for (int s = 1; s <= steps_to_run; ++s) {
    const Batch b = batch_for_step(s);
    const double want_loss = reference_step(reference, b);
    const double loss = model.step(b);
    double mine_worst = 0;
    const bool ok = matches_reference(rank, s, loss, want_loss, model.params(),
                                      model.blocks_of(reference), mine_worst);
    // Every rank learns whether any rank failed, so all exit with the same code.
    int mine = ok ? 1 : 0, all = 0;
    double worst = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    MPI_Allreduce(&mine_worst, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    passed = passed && all == 1;
    if (rank == 0)
      fmt::print("step {}: loss {:.12f} (single process {:.12f}), max relative error {:.2g}\n", s,
                 loss, want_loss, worst);
  }
  if (rank == 0) fmt::print("{}\n", passed ? "dp_tp_step: verified" : "dp_tp_step: FAILED");
  return passed;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  bool passed = false;
  try {
    passed = run();
  } catch (const std::exception& e) {
    // The other ranks may be waiting in a collective: take them down rather than hang.
    fmt::print(stderr, "dp_tp_step: {}\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return passed ? 0 : 1;
}
