// tp_mlp: a Megatron tensor-parallel MLP, forward and backward, with every communication a
// dtensor plan instead of a hand-written collective (seed 000's mappings).
//
//   Y = GeLU(X·A)·B     X [batch, hidden], A [hidden, ffn], B [ffn, hidden]
//
// On a 1-D mesh of 4 ranks named "tp", A is column-parallel (Shard(1)) and B row-parallel
// (Shard(0)), so each rank computes GeLU(X·A_r)·B_r on its own and the result is Partial(sum):
// one plan makes it Replicate. The backward runs each forward plan's gradient plan, or its
// adjoint where the two are equal.
//
// The program
//   1. prints seed 000's six mappings (copy, reduce, scatter, gather, reduce-scatter,
//      all-gather) as forward plans with their backward plans, runs each on MPI and checks it;
//   2. runs the tensor-parallel MLP (input Replicate, output Partial -> Replicate);
//   3. runs the sequence-parallel MLP (input Shard(0) all-gathered before the column-parallel
//      linear, output reduce-scattered to Shard(0) after the row-parallel one);
// and checks Y, dX, dA and dB against the unsharded MLP computed on every rank from the same
// seed. Exits 1 when anything differs, printing what.
//
//   mpirun -np 4 build/<dir>/examples/example_tp_mlp
//   ctest --test-dir build/<dir> -R example_tp_mlp
#include <dtensor/backend/mpi.hpp>
#include <dtensor/dtensor.hpp>
#include <dtensor/execute.hpp>
#include <dtensor/verify.hpp>

#include <fmt/core.h>
#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace dtensor;

// Row-major, like dtensor's local blocks, so a Matrix's storage is a block.
using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

constexpr int tp_size = 4;
constexpr std::int64_t batch = 8, hidden = 16, ffn = 32;
// Sums run in a different order on the sharded path: equal to rounding, not bit for bit.
constexpr double tolerance = 1e-12;

// ---------------------------------------------------------------------------------------------
// Local blocks and plans

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
// redistribution in this program goes through here.
Matrix redistribute(const Plan& plan, MpiBackend& backend, const Matrix& block) {
  const Shape shape = plan.dst().local_shape(backend.rank());
  Matrix out(shape[0], shape[1]);
  execute(plan, backend,
          std::span<const double>(block.data(), static_cast<std::size_t>(block.size())),
          std::span<double>(out.data(), static_cast<std::size_t>(out.size())));
  return out;
}

// "all_reduce", "chunk + all_gather", or "nothing" for an empty plan.
std::string steps(const Plan& plan) {
  std::string out;
  for (const Step& s : plan) out += fmt::format("{}{}", out.empty() ? "" : " + ", name(s.kind));
  return out.empty() ? "nothing" : out;
}

// "P(sum) -> R: all_reduce", for a plan on a 1-D mesh.
std::string transition(const Plan& plan) {
  return fmt::format("{} -> {}: {}", plan.src().placement(0), plan.dst().placement(0), steps(plan));
}

// ---------------------------------------------------------------------------------------------
// The check

// Compares this rank's blocks with the reference's and collects the verdict of all ranks.
class Verdict {
 public:
  explicit Verdict(int rank) : rank_(rank) {}

  void expect_near(std::string_view what, const Matrix& got, const Matrix& want) {
    ++compared_;
    if (got.rows() != want.rows() || got.cols() != want.cols()) {
      fmt::print(stderr, "rank {}: {} has shape {}x{}, the reference {}x{}\n", rank_, what,
                 got.rows(), got.cols(), want.rows(), want.cols());
      failed_ = true;
      return;
    }
    if (want.size() == 0) return;
    const double scale = std::max(1.0, want.cwiseAbs().maxCoeff());
    const double error = (got - want).cwiseAbs().maxCoeff() / scale;
    worst_ = std::max(worst_, error);
    if (!(error <= tolerance)) {
      fmt::print(stderr, "rank {}: {} differs from the reference: max relative error {:.3g}\n",
                 rank_, what, error);
      failed_ = true;
    }
  }

  // Collective: true on every rank when no rank saw a difference.
  [[nodiscard]] bool all_passed() const {
    int mine = failed_ ? 0 : 1, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    return all == 1;
  }
  // Collective: the largest relative error any rank saw.
  [[nodiscard]] double worst_error() const {
    double all = 0;
    MPI_Allreduce(&worst_, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return all;
  }
  [[nodiscard]] int compared() const { return compared_; }

 private:
  int rank_;
  bool failed_ = false;
  double worst_ = 0;
  int compared_ = 0;
};

// ---------------------------------------------------------------------------------------------
// 1. Seed 000's mappings as plans

// One of seed 000's autograd functions: what its forward does to the layout, and the layout in
// which its backward receives the gradient.
struct Mapping {
  std::string_view name;  // seed 000's helper
  Placement from, to, grad;
};

// Megatron's backward functions are *gradient plans* (plan_backward, PyTorch's
// Redistribute.backward): the gradient arrives in the placements `grad` and leaves in the
// forward source's, a Partial source becoming Replicate. The *adjoint* (plan_adjoint)
// transposes what the forward does to the local buffers, so it reads every Replicate as
// Partial(sum) and back (the transpose of making copies is summing them). The two agree where
// the gradients are in exactly those dual placements: seed 000's sequence-parallel pair,
// reduce-scatter (backward S(0) -> R) and all-gather (backward P -> S(0)).
constexpr Mapping mappings[] = {
    {"copy_to_parallel_region", Replicate(), Replicate(), Partial()},
    {"reduce_from_parallel_region", Partial(), Replicate(), Replicate()},
    {"scatter_to_parallel_region", Replicate(), Shard(-1), Shard(-1)},
    {"gather_from_parallel_region", Shard(-1), Replicate(), Replicate()},
    {"reduce_scatter_to_parallel_region", Partial(), Shard(0), Shard(0)},
    {"all_gather_from_parallel_region", Shard(0), Replicate(), Partial()},
};

// The global-view tensor's block (each element holds its own linear index; Partial blocks
// hold distinct parts that sum to it), as a matrix.
Matrix global_view(const Layout& layout, int rank) {
  const std::vector<double> v = global_view_block<double>(layout, rank);
  const Shape shape = layout.local_shape(rank);
  return Eigen::Map<const Matrix>(v.data(), shape[0], shape[1]);
}

void show_mappings(const DeviceMesh& mesh, MpiBackend& backend, Verdict& verdict) {
  const int rank = backend.rank();
  const Shape shape{batch, hidden};
  if (rank == 0)
    fmt::print(
        "seed 000's mappings on mesh {}, tensor {} (each run forward and backward):\n"
        "  {:<34} {:<32} {:<32} {}\n",
        mesh, shape, "mapping", "forward", "backward (gradient plan)", "adjoint");
  for (const Mapping& m : mappings) {
    const Layout from(mesh, {m.from}, shape, DType::f64);
    const Layout to(mesh, {m.to}, shape, DType::f64);
    const Plan forward = plan_redistribute(from, to);
    const Plan backward = plan_backward(from, to, {m.grad});
    const Plan transpose = plan_adjoint(from, to);
    // Run both on the global view: every target here is a plain block of the tensor.
    verdict.expect_near(fmt::format("{} forward", m.name),
                        redistribute(forward, backend, global_view(from, rank)),
                        global_view(to, rank));
    verdict.expect_near(fmt::format("{} backward", m.name),
                        redistribute(backward, backend, global_view(backward.src(), rank)),
                        global_view(backward.dst(), rank));
    if (rank == 0)
      fmt::print("  {:<34} {:<32} {:<32} {}\n", m.name, transition(forward), transition(backward),
                 backward == transpose ? "= backward" : transition(transpose));
  }
}

// ---------------------------------------------------------------------------------------------
// The MLP

// Megatron's GeLU (tanh approximation) and its exact derivative.
constexpr double gelu_c = 0.7978845608028654;  // sqrt(2 / pi)
double gelu(double x) { return 0.5 * x * (1 + std::tanh(gelu_c * (x + 0.044715 * x * x * x))); }
double gelu_grad(double x) {
  const double t = std::tanh(gelu_c * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * gelu_c * (1 + 3 * 0.044715 * x * x);
}

// The inputs, the same on every rank (one seed), and the gradient of the loss w.r.t. Y.
struct Problem {
  Matrix X, A, B, dY;
};

Problem make_problem() {
  std::mt19937 gen(2024);
  Problem p;
  p.X = random_matrix(gen, batch, hidden);
  p.A = random_matrix(gen, hidden, ffn);
  p.B = random_matrix(gen, ffn, hidden);
  p.dY = random_matrix(gen, batch, hidden);
  return p;
}

struct Gradients {
  Matrix dX, dA, dB;
};

// The MLP's math on whatever it is given: the whole matrices for the reference, one rank's
// columns of A and rows of B for the parallel runs, which then get a Partial(sum) Y and dX.
struct MlpMath {
  Matrix A, B;
  Matrix H;  // X·A, kept for the backward

  Matrix forward(const Matrix& X) {
    H = X * A;
    return H.unaryExpr(&gelu) * B;
  }
  // dX, dA and dB from dY; X is the forward's input.
  Gradients backward(const Matrix& X, const Matrix& dY) const {
    const Matrix dH = (dY * B.transpose()).cwiseProduct(H.unaryExpr(&gelu_grad));
    return {dH * A.transpose(), X.transpose() * dH, H.unaryExpr(&gelu).transpose() * dY};
  }
};

// The unsharded MLP, on every rank.
struct Reference {
  Matrix Y;
  Gradients grad;
};

Reference reference_mlp(const Problem& p) {
  MlpMath mlp{p.A, p.B, {}};
  Matrix Y = mlp.forward(p.X);
  return {Y, mlp.backward(p.X, p.dY)};
}

// 2. Input Replicate; output Partial(sum) -> Replicate. Seed 000's copy and reduce.
void tensor_parallel_mlp(const DeviceMesh& mesh, MpiBackend& backend, const Problem& p,
                         const Reference& want, Verdict& verdict) {
  const int rank = backend.rank();
  const Layout x(mesh, {Replicate()}, {batch, hidden}, DType::f64);
  const Layout a(mesh, {Shard(1)}, {hidden, ffn}, DType::f64);  // column-parallel
  const Layout b(mesh, {Shard(0)}, {ffn, hidden}, DType::f64);  // row-parallel
  const Layout y_partial(mesh, {Partial()}, {batch, hidden}, DType::f64);
  const Layout y(mesh, {Replicate()}, {batch, hidden}, DType::f64);

  // copy: identity forward; its gradient arrives Partial (each rank's dX from its columns).
  const Plan copy = plan_redistribute(x, x);
  const Plan copy_backward = plan_backward(x, x, {Partial()});
  // reduce: all-reduce forward; the Replicate gradient passes through.
  const Plan reduce = plan_redistribute(y_partial, y);
  const Plan reduce_backward = plan_backward(y_partial, y);

  MlpMath mlp{block_of(a, rank, p.A), block_of(b, rank, p.B), {}};
  const Matrix x_in = redistribute(copy, backend, p.X);
  const Matrix y_out = redistribute(reduce, backend, mlp.forward(x_in));

  const Matrix dy = redistribute(reduce_backward, backend, p.dY);
  const Gradients g = mlp.backward(x_in, dy);
  const Matrix dx = redistribute(copy_backward, backend, g.dX);

  verdict.expect_near("tensor parallel Y", y_out, want.Y);
  verdict.expect_near("tensor parallel dX", dx, want.grad.dX);
  verdict.expect_near("tensor parallel dA (this rank's columns)", g.dA,
                      block_of(a, rank, want.grad.dA));
  verdict.expect_near("tensor parallel dB (this rank's rows)", g.dB,
                      block_of(b, rank, want.grad.dB));
  if (rank == 0)
    fmt::print(
        "tensor parallel MLP: X {} -> copy ({}) -> X·A_r, GeLU, ·B_r -> Y {} -> reduce ({}) -> {}\n"
        "  backward: dY {} -> {} -> local grads -> dX {} -> {} -> {}\n",
        x.placements(), steps(copy), y_partial.placements(), steps(reduce), y.placements(),
        reduce_backward.src().placements(), steps(reduce_backward),
        copy_backward.src().placements(), steps(copy_backward), copy_backward.dst().placements());
}

// 3. Sequence parallel: the batch (sequence) dim is sharded outside the MLP. The forward plans
// are seed 000's all-gather and reduce-scatter; their backward plans are their adjoints.
void sequence_parallel_mlp(const DeviceMesh& mesh, MpiBackend& backend, const Problem& p,
                           const Reference& want, Verdict& verdict) {
  const int rank = backend.rank();
  const Layout x_seq(mesh, {Shard(0)}, {batch, hidden}, DType::f64);
  const Layout x(mesh, {Replicate()}, {batch, hidden}, DType::f64);
  const Layout a(mesh, {Shard(1)}, {hidden, ffn}, DType::f64);
  const Layout b(mesh, {Shard(0)}, {ffn, hidden}, DType::f64);
  const Layout y_partial(mesh, {Partial()}, {batch, hidden}, DType::f64);
  const Layout y_seq(mesh, {Shard(0)}, {batch, hidden}, DType::f64);

  const Plan all_gather = plan_redistribute(x_seq, x);
  const Plan reduce_scatter = plan_redistribute(y_partial, y_seq);

  MlpMath mlp{block_of(a, rank, p.A), block_of(b, rank, p.B), {}};
  const Matrix x_in = redistribute(all_gather, backend, block_of(x_seq, rank, p.X));
  const Matrix y_out = redistribute(reduce_scatter, backend, mlp.forward(x_in));

  // adjoint(reduce-scatter) all-gathers dY; adjoint(all-gather) reduce-scatters the Partial dX.
  const Matrix dy = redistribute(adjoint(reduce_scatter), backend, block_of(y_seq, rank, p.dY));
  const Gradients g = mlp.backward(x_in, dy);
  const Matrix dx = redistribute(adjoint(all_gather), backend, g.dX);

  verdict.expect_near("sequence parallel Y (this rank's rows)", y_out,
                      block_of(y_seq, rank, want.Y));
  verdict.expect_near("sequence parallel dX (this rank's rows)", dx,
                      block_of(x_seq, rank, want.grad.dX));
  verdict.expect_near("sequence parallel dA", g.dA, block_of(a, rank, want.grad.dA));
  verdict.expect_near("sequence parallel dB", g.dB, block_of(b, rank, want.grad.dB));
  if (rank == 0)
    fmt::print(
        "sequence parallel MLP: X {} -> {} -> X·A_r, GeLU, ·B_r -> Y {} -> {} -> {}\n"
        "  backward: dY {} -> {} -> local grads -> dX {} -> {} -> {}\n",
        x_seq.placements(), steps(all_gather), y_partial.placements(), steps(reduce_scatter),
        y_seq.placements(), y_seq.placements(), steps(adjoint(reduce_scatter)),
        y_partial.placements(), steps(adjoint(all_gather)), x_seq.placements());
}

bool run() {
  const DeviceMesh mesh({tp_size}, {"tp"});
  MpiBackend backend(mesh);
  Verdict verdict(backend.rank());

  show_mappings(mesh, backend, verdict);
  const Problem problem = make_problem();
  const Reference want = reference_mlp(problem);
  tensor_parallel_mlp(mesh, backend, problem, want, verdict);
  sequence_parallel_mlp(mesh, backend, problem, want, verdict);

  const bool passed = verdict.all_passed();
  const double worst = verdict.worst_error();
  if (backend.rank() == 0) {
    fmt::print(
        "checked {} blocks per rank against the unsharded MLP and the global view: "
        "max relative error {:.2g}\n",
        verdict.compared(), worst);
    fmt::print("{}\n", passed ? "tp_mlp: verified" : "tp_mlp: FAILED");
  }
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
    fmt::print(stderr, "tp_mlp: {}\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return passed ? 0 : 1;
}
