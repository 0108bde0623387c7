// sequence_parallel: seed 002's sequence parallelism (DeepSpeed-Ulysses style) with every
// communication a dtensor plan, checked against the unsharded computation.
//
// On a 1-D mesh of 4 ranks named "cp", activations [seq, heads, head_dim] arrive sharded by
// sequence (Shard(0)). Attention needs whole sequences, so an all-to-all reshards them by heads
// (Shard(1)), every rank runs softmax attention for its heads, and a second all-to-all brings
// the output back to Shard(0). In dtensor that is two layouts and plan_redistribute; the
// backward is plan_backward of the same layouts, which is the adjoint: the all-to-alls reversed.
//
// The program
//   1. runs attention forward and backward that way for an even shape and two uneven ones
//      (uneven pieces follow torch.chunk: 62 rows over 4 ranks are 16, 16, 16, 14; 6 heads are
//      2, 2, 2, 0) and compares the output and dQ, dK, dV with the unsharded attention that every
//      rank computes from the same seed (whose backward is itself checked by finite differences,
//      "FD");
//   2. runs seed 002's split/gather autograd pairs with grad_scale "up", "down" and none, each
//      twice: by hand as the seed writes it (plain loops and MPI_Allgatherv) and as dtensor
//      gradient plans, and prints which plan each grad_scale is;
// and exits 1 on every rank when anything differs, printing "sequence_parallel: verified"
// otherwise.
//
//   mpirun -np 4 build/<dir>/examples/example_sequence_parallel
//   ctest --test-dir build/<dir> -R example_sequence_parallel
#include <dtensor/backend/mpi.hpp>
#include <dtensor/dtensor.hpp>
#include <dtensor/execute.hpp>
#include <dtensor/explain.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

using namespace dtensor;

constexpr int cp_size = 4;
// Attention is bit for bit the same per head, sharded or not; a reduce-scatter adds g copies
// where the hand-written version multiplies by g: equal to rounding.
constexpr double tolerance = 1e-12;

// ---------------------------------------------------------------------------------------------
// Blocks of [seq, heads, head_dim] tensors

// A row-major block of a 3-D tensor (a rank's block, or the whole tensor), indexed from its own
// corner: exactly the buffer execute() reads and writes.
struct Block {
  Shape shape;
  std::vector<double> data;

  explicit Block(const Shape& s)
      : shape(s), data(static_cast<std::size_t>(s[0] * s[1] * s[2]), 0.0) {}
  double& operator()(std::int64_t i, std::int64_t j, std::int64_t k) {
    return data[static_cast<std::size_t>((i * shape[1] + j) * shape[2] + k)];
  }
  double operator()(std::int64_t i, std::int64_t j, std::int64_t k) const {
    return data[static_cast<std::size_t>((i * shape[1] + j) * shape[2] + k)];
  }
};

Block random_tensor(std::mt19937& gen, const Shape& shape) {
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  Block t(shape);
  for (double& x : t.data) x = uniform(gen);
  return t;
}

// The part of `whole` inside `box`: how every rank cuts its block out of the reference.
Block cut(const Block& whole, const Box& box) {
  Block b(box.shape);
  for (std::int64_t i = 0; i < box.shape[0]; ++i)
    for (std::int64_t j = 0; j < box.shape[1]; ++j)
      for (std::int64_t k = 0; k < box.shape[2]; ++k)
        b(i, j, k) = whole(box.offset[0] + i, box.offset[1] + j, box.offset[2] + k);
  return b;
}

// Runs `plan` on this rank's block of its source and returns this rank's block of its target.
Block redistribute(const Plan& plan, MpiBackend& backend, const Block& src) {
  Block dst(plan.dst().local_shape(backend.rank()));
  execute(plan, backend, std::span<const double>(src.data), std::span<double>(dst.data));
  return dst;
}

double max_diff(const Block& a, const Block& b) {
  if (a.shape != b.shape) return INFINITY;
  double d = 0;
  for (std::size_t i = 0; i < a.data.size(); ++i) d = std::max(d, std::abs(a.data[i] - b.data[i]));
  return d;
}

// The largest difference over every rank: all ranks agree on the verdict.
double max_over_ranks(double local) {
  double global = 0;
  MPI_Allreduce(&local, &global, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return global;
}

std::string step_names(const Plan& plan) {
  std::string out;
  for (const Step& s : plan)
    out += fmt::format("{}{}{}", out.empty() ? "" : " + ", name(s.kind), s.padded ? "*" : "");
  return out.empty() ? "(none)" : out;
}

// ---------------------------------------------------------------------------------------------
// Softmax attention on whatever heads a block holds, each over the whole sequence

struct Grads {
  Block dq, dk, dv;
};

// Row i of softmax(q k^T / sqrt(head_dim)) for head h.
std::vector<double> attention_row(const Block& q, const Block& k, std::int64_t h, std::int64_t i) {
  const std::int64_t seq = q.shape[0], dim = q.shape[2];
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  std::vector<double> p(static_cast<std::size_t>(seq));
  double top = -INFINITY;
  for (std::int64_t j = 0; j < seq; ++j) {
    double s = 0;
    for (std::int64_t d = 0; d < dim; ++d) s += q(i, h, d) * k(j, h, d);
    p[static_cast<std::size_t>(j)] = s * scale;
    top = std::max(top, s * scale);
  }
  double total = 0;
  for (double& x : p) total += (x = std::exp(x - top));
  for (double& x : p) x /= total;
  return p;
}

Block attention_forward(const Block& q, const Block& k, const Block& v) {
  Block out(q.shape);
  for (std::int64_t h = 0; h < q.shape[1]; ++h)
    for (std::int64_t i = 0; i < q.shape[0]; ++i) {
      const std::vector<double> p = attention_row(q, k, h, i);
      for (std::int64_t j = 0; j < q.shape[0]; ++j)
        for (std::int64_t d = 0; d < q.shape[2]; ++d)
          out(i, h, d) += p[static_cast<std::size_t>(j)] * v(j, h, d);
    }
  return out;
}

// With P the probabilities: dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(P * dP)),
// dQ = dS K / sqrt(head_dim), dK = dS^T Q / sqrt(head_dim). P is recomputed, as flash attention
// does, rather than kept from the forward.
Grads attention_backward(const Block& q, const Block& k, const Block& v, const Block& dout) {
  const std::int64_t seq = q.shape[0], dim = q.shape[2];
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  Grads g{Block(q.shape), Block(q.shape), Block(q.shape)};
  std::vector<double> dp(static_cast<std::size_t>(seq));
  for (std::int64_t h = 0; h < q.shape[1]; ++h)
    for (std::int64_t i = 0; i < seq; ++i) {
      const std::vector<double> p = attention_row(q, k, h, i);
      double p_dot_dp = 0;
      for (std::int64_t j = 0; j < seq; ++j) {
        const double pj = p[static_cast<std::size_t>(j)];
        double dpj = 0;
        for (std::int64_t d = 0; d < dim; ++d) {
          g.dv(j, h, d) += pj * dout(i, h, d);
          dpj += dout(i, h, d) * v(j, h, d);
        }
        dp[static_cast<std::size_t>(j)] = dpj;
        p_dot_dp += pj * dpj;
      }
      for (std::int64_t j = 0; j < seq; ++j) {
        const double ds =
            p[static_cast<std::size_t>(j)] * (dp[static_cast<std::size_t>(j)] - p_dot_dp);
        for (std::int64_t d = 0; d < dim; ++d) {
          g.dq(i, h, d) += ds * k(j, h, d) * scale;
          g.dk(j, h, d) += ds * q(i, h, d) * scale;
        }
      }
    }
  return g;
}

// The loss sum(attention(q, k, v) * w), whose gradient with respect to the output is w.
double loss(const Block& q, const Block& k, const Block& v, const Block& w) {
  const Block out = attention_forward(q, k, v);
  double l = 0;
  for (std::size_t i = 0; i < out.data.size(); ++i) l += out.data[i] * w.data[i];
  return l;
}

// The reference's own check: each of dQ, dK, dV against a central difference of the loss
// along a random direction, so the sharded run is not compared with a wrong backward.
bool backward_matches_finite_differences(const Block& q, const Block& k, const Block& v,
                                         const Block& w, const Grads& g, std::mt19937& gen) {
  const Block* inputs[] = {&q, &k, &v};
  const Block* grads[] = {&g.dq, &g.dk, &g.dv};
  const double eps = 1e-5;
  for (int which = 0; which < 3; ++which) {
    const Block dir = random_tensor(gen, q.shape);
    Block plus[] = {q, k, v}, minus[] = {q, k, v};
    double analytic = 0;
    for (std::size_t i = 0; i < dir.data.size(); ++i) {
      plus[which].data[i] = inputs[which]->data[i] + eps * dir.data[i];
      minus[which].data[i] = inputs[which]->data[i] - eps * dir.data[i];
      analytic += grads[which]->data[i] * dir.data[i];
    }
    const double numeric =
        (loss(plus[0], plus[1], plus[2], w) - loss(minus[0], minus[1], minus[2], w)) / (2 * eps);
    if (std::abs(numeric - analytic) > 1e-6 * std::max(1.0, std::abs(analytic))) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// 1. Ulysses: all-to-all S(seq) -> S(heads), attention per head, all-to-all back

bool ulysses_attention(MpiBackend& backend, const Shape& shape, bool print_plans) {
  const int rank = backend.rank();
  const DeviceMesh& mesh = backend.mesh();
  const Layout by_seq(mesh, {Shard(0)}, shape, DType::f64);
  const Layout by_heads(mesh, {Shard(1)}, shape, DType::f64);

  const Plan to_heads = plan_redistribute(by_seq, by_heads);
  const Plan to_seq = plan_redistribute(by_heads, by_seq);
  // The gradients flow through the same reshuffles backwards: the gradient of to_seq turns the
  // output's gradient (S(seq)) into S(heads), that of to_heads brings dQ, dK, dV back to S(seq).
  const Plan to_heads_grad = plan_backward(by_seq, by_heads);
  const Plan to_seq_grad = plan_backward(by_heads, by_seq);

  // The unsharded reference, computed whole on every rank from the same seed.
  std::mt19937 gen(2024);
  const Block q = random_tensor(gen, shape), k = random_tensor(gen, shape),
              v = random_tensor(gen, shape);
  const Block dout = random_tensor(gen, shape);  // the gradient of the loss sum(out * dout)
  const Block out = attention_forward(q, k, v);
  const Grads grads = attention_backward(q, k, v, dout);
  const bool reference_ok = backward_matches_finite_differences(q, k, v, dout, grads, gen);

  // Sequence parallel: this rank starts with its rows of every sequence-sharded activation.
  const Box mine = by_seq.local_box(rank);
  const Block q_heads = redistribute(to_heads, backend, cut(q, mine));
  const Block k_heads = redistribute(to_heads, backend, cut(k, mine));
  const Block v_heads = redistribute(to_heads, backend, cut(v, mine));
  // Whole sequences for this rank's heads: attention needs no communication.
  const Block out_heads = attention_forward(q_heads, k_heads, v_heads);
  const Block out_seq = redistribute(to_seq, backend, out_heads);

  // Backward: the output's gradient arrives sequence-sharded, like the output.
  const Block dout_heads = redistribute(to_seq_grad, backend, cut(dout, mine));
  const Grads g = attention_backward(q_heads, k_heads, v_heads, dout_heads);
  const Block dq_seq = redistribute(to_heads_grad, backend, g.dq);
  const Block dk_seq = redistribute(to_heads_grad, backend, g.dk);
  const Block dv_seq = redistribute(to_heads_grad, backend, g.dv);

  const double diff = max_over_ranks(
      std::max({max_diff(out_seq, cut(out, mine)), max_diff(dq_seq, cut(grads.dq, mine)),
                max_diff(dk_seq, cut(grads.dk, mine)), max_diff(dv_seq, cut(grads.dv, mine))}));
  int reference_ok_everywhere = reference_ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &reference_ok_everywhere, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);

  // What the plans are: one all-to-all each way, and each gradient plan is the adjoint of its
  // forward plan (all-to-all(i -> j) transposes to all-to-all(j -> i)).
  const bool one_all_to_all = to_heads.size() == 1 && to_heads[0].kind == StepKind::all_to_all;
  const bool grad_is_adjoint = to_heads_grad.steps() == adjoint(to_heads).steps() &&
                               to_seq_grad.steps() == adjoint(to_seq).steps();
  const bool ok =
      diff <= tolerance && reference_ok_everywhere == 1 && one_all_to_all && grad_is_adjoint;
  if (rank == 0) {
    if (print_plans) {
      fmt::print("forward, before attention:\n{}", explain(to_heads));
      fmt::print("its gradient plan (plan_backward):\n{}", explain(to_heads_grad));
      fmt::print("gradient plan == adjoint(forward plan), step for step: {}\n\n",
                 grad_is_adjoint ? "yes" : "no");
      fmt::print("  {:<12}  {:<12}  {:<12}  {:<20}  {:<16}  {:<10}  {}\n", "shape", "to_heads",
                 "to_seq", "gradients=adjoints", "reference=FD", "max |diff|", "");
    }
    fmt::print("  {:<12}  {:<12}  {:<12}  {:<20}  {:<16}  {:<10.1e}  {}\n",
               fmt::format("{}", shape), step_names(to_heads), step_names(to_seq),
               grad_is_adjoint ? "yes" : "no", reference_ok_everywhere == 1 ? "yes" : "no", diff,
               ok ? "ok" : "DIFFERS");
  }
  return ok;
}

// ---------------------------------------------------------------------------------------------
// 2. Seed 002's split/gather pairs with grad_scale
//
// The seed's hand-written autograd functions, on the sequence dim of a group of g ranks:
//   gather: forward all-gathers the pieces;   backward keeps this rank's piece of the gradient
//   split:  forward keeps this rank's piece;  backward all-gathers the gradient's pieces
// and then multiplies the gradient by g ("up"), divides it by g ("down") or leaves it (none).
// The seed needs the sequence to divide by g; here 62 rows are cut as torch.chunk cuts them.
//
// The hand-written backward of gather communicates nothing, yet the true gradient is the sum
// (or the mean) of every rank's gradient: grad_scale is the reduce-scatter it skips, exact only
// for buffers of a known shape. dtensor says the same with the gradient's placement and then
// really reduces: Partial(sum) (the ranks' gradients add) or Partial(avg) (they average).
//   * every rank's gradient is the same tensor G (the computation after the gather is
//     replicated, the usual case): sum gives g * G = "up"; avg gives G = none = Replicate.
//   * every rank's gradient is zero outside its own rows (each rank's loss reads only its own
//     rows of the gathered tensor): sum gives the piece = none; avg gives piece / g = "down".
// So "down" is Partial(avg) only for the second shape; for the first it silently differs from
// the mean by a factor g.
// The backward of split all-gathers, and then every rank holds the same G:
//   none: plan_backward's all-gather. "up": the g replicas add (an all-reduce of sum, g * G).
//   "down": G / g on every rank is PyTorch's Replicate -> Partial(sum) (a scale step): the
//   gradient is left Partial(sum) for an outer all-reduce to finish. plan_adjoint makes that
//   same Partial(sum) gradient with no communication (the piece among zeros: a fill step);
//   equal once summed over the ranks, not buffer for buffer.

// The seed's _gather: every rank's rows, in rank order, with a plain MPI call.
Block gather_by_hand(const Layout& by_seq, const Block& piece) {
  const std::int64_t row = by_seq.global_shape()[1] * by_seq.global_shape()[2];
  std::vector<int> counts(cp_size), displs(cp_size);
  for (int r = 0; r < cp_size; ++r) {
    counts[static_cast<std::size_t>(r)] = static_cast<int>(by_seq.local_numel(r));
    displs[static_cast<std::size_t>(r)] = static_cast<int>(by_seq.global_offset(r)[0] * row);
  }
  Block whole(by_seq.global_shape());
  MPI_Allgatherv(piece.data.data(), static_cast<int>(piece.data.size()), MPI_DOUBLE,
                 whole.data.data(), counts.data(), displs.data(), MPI_DOUBLE, MPI_COMM_WORLD);
  return whole;
}

enum class GradScale { up, down, none };

Block scaled(Block b, GradScale scale) {
  const double g = cp_size;
  for (double& x : b.data)
    x = scale == GradScale::up ? x * g : scale == GradScale::down ? x / g : x;
  return b;
}

const char* spelling(GradScale s) {
  return s == GradScale::up ? "up" : s == GradScale::down ? "down" : "none";
}

struct Row {
  const char* pair;
  GradScale scale;
  const char* gradients;  // what the gradient buffers hold on each rank
  std::string library;    // which dtensor plan(s)
  std::string steps;
  double diff;
};

bool split_gather_pairs(MpiBackend& backend, const Shape& shape) {
  const int rank = backend.rank();
  const DeviceMesh& mesh = backend.mesh();
  const Layout by_seq(mesh, {Shard(0)}, shape, DType::f64);
  const Layout replicated(mesh, {Replicate()}, shape, DType::f64);
  const Layout partial_sum(mesh, {Partial(ReduceOp::sum)}, shape, DType::f64);
  const Placements grad_sum{Partial(ReduceOp::sum)}, grad_avg{Partial(ReduceOp::avg)},
      grad_replicate{Replicate()};

  std::mt19937 gen(2);
  const Block x = random_tensor(gen, shape);  // the activation
  const Block w = random_tensor(gen, shape);  // a gradient
  const Box mine = by_seq.local_box(rank);
  std::vector<Row> rows;
  double forward_diff = 0, down_times_g_vs_avg = 0;

  // gather: S(seq) -> R forward. By hand with MPI_Allgatherv, with dtensor an all-gather.
  {
    const Plan gather = plan_redistribute(by_seq, replicated);
    forward_diff = std::max(forward_diff, max_diff(gather_by_hand(by_seq, cut(x, mine)),
                                                   redistribute(gather, backend, cut(x, mine))));
    // The two shapes of the ranks' gradients described above.
    const Block same_everywhere = w;
    Block own_rows_only(shape);
    const Block w_mine = cut(w, mine);
    std::copy(w_mine.data.begin(), w_mine.data.end(),
              own_rows_only.data.begin() + mine.offset[0] * shape[1] * shape[2]);

    auto backward = [&](GradScale scale, const char* gradients, const Block& grad,
                        const Placements& grad_placements, const char* placement_name) {
      const Block by_hand = scaled(cut(grad, mine), scale);  // the seed: split, then scale
      const Plan plan = plan_backward(by_seq, replicated, grad_placements);
      const Block by_plan = redistribute(plan, backend, grad);
      rows.push_back({"gather", scale, gradients,
                      fmt::format("plan_backward, gradient {}", placement_name), step_names(plan),
                      max_over_ranks(max_diff(by_hand, by_plan))});
    };
    backward(GradScale::up, "same G", same_everywhere, grad_sum, "P(sum)");
    backward(GradScale::none, "same G", same_everywhere, grad_replicate, "R");
    backward(GradScale::none, "same G", same_everywhere, grad_avg, "P(avg)");
    backward(GradScale::none, "own rows", own_rows_only, grad_sum, "P(sum)");
    backward(GradScale::down, "own rows", own_rows_only, grad_avg, "P(avg)");

    // The trap: with the same G on every rank, Partial(avg) gives g times what "down" gives.
    const Block down = scaled(cut(same_everywhere, mine), GradScale::down);
    const Block avg = redistribute(plan_backward(by_seq, replicated, grad_avg), backend, w);
    down_times_g_vs_avg = max_over_ranks(max_diff(scaled(down, GradScale::up), avg));
  }

  // split: R -> S(seq) forward. By hand a slice, with dtensor a chunk (no communication).
  {
    const Plan split = plan_redistribute(replicated, by_seq);
    forward_diff = std::max(forward_diff, max_diff(cut(x, mine), redistribute(split, backend, x)));
    // The gradient of the split's output arrives sharded like it.
    const Block grad = cut(w, mine);
    const Plan gather_grad = plan_backward(replicated, by_seq);             // S(seq) -> R
    const Plan replicas_add = plan_redistribute(partial_sum, replicated);   // P(sum) -> R
    const Plan leave_partial = plan_redistribute(replicated, partial_sum);  // R -> P(sum)
    const Block gathered = redistribute(gather_grad, backend, grad);

    auto backward = [&](GradScale scale, const std::string& library, const std::string& steps,
                        const Block& by_plan) {
      const Block by_hand = scaled(gather_by_hand(by_seq, grad), scale);
      rows.push_back(
          {"split", scale, "S(seq)", library, steps, max_over_ranks(max_diff(by_hand, by_plan))});
    };
    backward(GradScale::none, "plan_backward", step_names(gather_grad), gathered);
    backward(GradScale::up, "plan_backward, then P(sum) -> R",
             step_names(gather_grad) + " + " + step_names(replicas_add),
             redistribute(replicas_add, backend, gathered));
    backward(GradScale::down, "plan_backward, then R -> P(sum)",
             step_names(gather_grad) + " + " + step_names(leave_partial),
             redistribute(leave_partial, backend, gathered));

    // "down" against the adjoint: different buffers, the same Partial(sum) gradient, so compare
    // the sums over the ranks (a plain MPI_Allreduce).
    const Plan adjoint_of_split = plan_adjoint(replicated, by_seq);
    Block down_sum = scaled(gather_by_hand(by_seq, grad), GradScale::down);
    Block adjoint_sum = redistribute(adjoint_of_split, backend, grad);
    MPI_Allreduce(MPI_IN_PLACE, down_sum.data.data(), static_cast<int>(down_sum.data.size()),
                  MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, adjoint_sum.data.data(), static_cast<int>(adjoint_sum.data.size()),
                  MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    rows.push_back({"split", GradScale::down, "S(seq)", "plan_adjoint (summed over ranks)",
                    step_names(adjoint_of_split), max_over_ranks(max_diff(down_sum, adjoint_sum))});
  }

  forward_diff = max_over_ranks(forward_diff);
  bool ok = forward_diff <= tolerance && down_times_g_vs_avg <= tolerance;
  for (const Row& r : rows) ok = ok && r.diff <= tolerance;
  if (rank == 0) {
    fmt::print(
        "  forward gather (MPI_Allgatherv vs S(seq) -> R) and split (slice vs R -> S(seq)): "
        "{}\n",
        forward_diff <= tolerance ? "equal" : "DIFFER");
    fmt::print("  {:<6}  {:<10}  {:<9}  {:<33}  {:<28}  {}\n", "pair", "grad_scale", "gradient",
               "dtensor", "plan steps", "equal");
    for (const Row& r : rows)
      fmt::print("  {:<6}  {:<10}  {:<9}  {:<33}  {:<28}  {}\n", r.pair, spelling(r.scale),
                 r.gradients, r.library, r.steps,
                 r.diff <= tolerance ? "yes" : fmt::format("NO (max |diff| {:.1e})", r.diff));
    fmt::print("  (* uneven pieces padded to the group's largest)\n");
    fmt::print(
        "  with the same G on every rank, g * \"down\" == P(avg), so \"down\" is not the mean: "
        "{}\n",
        down_times_g_vs_avg <= tolerance ? "yes" : "NO");
  }
  return ok;
}

bool run() {
  const DeviceMesh mesh({cp_size}, {"cp"});
  MpiBackend backend(mesh);
  const int rank = backend.rank();
  bool ok = true;

  if (rank == 0)
    fmt::print("1. Ulysses attention on mesh {}: S(seq) -> S(heads) and back\n\n", mesh);
  ok = ulysses_attention(backend, {64, 8, 16}, true) && ok;
  ok = ulysses_attention(backend, {62, 8, 16}, false) && ok;  // 16, 16, 16, 14 rows
  ok = ulysses_attention(backend, {64, 6, 16}, false) && ok;  // 2, 2, 2, 0 heads

  if (rank == 0) fmt::print("\n2. seed 002's split/gather pairs, by hand and as plans\n");
  ok = split_gather_pairs(backend, {62, 8, 16}) && ok;

  int all = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (rank == 0) fmt::print("\nsequence_parallel: {}\n", all == 1 ? "verified" : "FAILED");
  return all == 1;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  bool passed = false;
  try {
    passed = run();  // the backend lives inside run(), so it is gone before MPI_Finalize
  } catch (const std::exception& e) {
    // The other ranks may be waiting in a collective: take them down rather than hang.
    fmt::print(stderr, "sequence_parallel: {}\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return passed ? 0 : 1;
}
