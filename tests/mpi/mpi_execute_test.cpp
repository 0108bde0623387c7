// The MPI backend under mpirun -np 8: every rank runs plans on its own block of the global
// view; rank 0 gathers the results and compares them with the simulated backend's, which
// verify_on_simulator checks against the global view.
#include <dtensor/backend/mpi.hpp>
#include <dtensor/dtensor.hpp>

#include "agreement.hpp"
#include "run_against_simulator.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <tuple>

#include <unistd.h>

namespace {

using namespace dtensor;

struct Case {
  std::string_view mesh, from, to;
  Objective objective = Objective::time;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int world_rank = 0, world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  const Case cases[] = {{"8", "S(0)", "R"},
                        {"8", "R", "S(1)"},
                        {"8", "P", "R"},
                        {"8", "P", "S(0)"},
                        {"8", "S(0)", "S(1)"},
                        {"8", "R", "P"},
                        {"8", "S(1)", "P"},
                        {"8", "P(sum)", "P(max)"},
                        {"8", "P(max)", "S(1)"},
                        {"2x4", "S(0),R", "R,S(0)"},
                        {"2x4", "S(0),S(0)", "R,S(0)"},
                        {"2x4", "P,S(1)", "R,S(0)"},
                        {"2x4", "S(0),S(1)", "S(1),S(0)"},
                        {"2x4", "R,P(avg)", "S(1),R"},
                        {"2x4", "P,P", "S(0),R"},  // the all-reduce in place in the target
                        {"2x4", "P(max),P", "S(1),R"},
                        {"2x4", "S(0),R", "S(1),S(0)"},
                        {"2x2x2", "S(0),S(1),R", "R,S(0),S(1)"},
                        {"2x2x2", "P,S(0),R", "R,R,S(0)"},
                        {"2x2x2", "P(max),S(1),P", "S(0),R,S(1)"},
                        // Exchanges into a Partial: each group's members split what none holds.
                        {"2x4", "R,S(0)", "P(sum),S(1)", Objective::bytes},
                        {"2x4", "S(0),S(1)", "P(max),S(0)", Objective::bytes},
                        {"2x2x2", "S(1),S(0),S(0)", "P(min),P(min),R", Objective::bytes},
                        {"2x2x2", "S(0),R,S(0)", "P(sum),S(0),S(0)"},
                        // Exchanges from a Partial: each group reduces parts, then delivers
                        // (of 5x7, all but P(max),S(1) and P(min),R,S(0) cut by elements).
                        {"8", "P(sum)", "S(0)", Objective::bytes},
                        {"2x4", "P(sum),S(0)", "S(0),S(1)", Objective::bytes},
                        {"2x4", "P(max),S(1)", "R,S(0)", Objective::bytes},
                        {"2x2x2", "S(0),P(sum),S(1)", "S(1),S(1),R", Objective::bytes},
                        {"2x2x2", "P(min),R,S(0)", "S(0),R,S(1)", Objective::bytes},
                        // (of 5x7, cut by elements in column-major order: parts packed)
                        {"2x4", "S(0),P(sum)", "S(1),S(1)", Objective::bytes},
                        {"2x2x2", "P(max),P(max),R", "S(1),S(0),S(1)", Objective::bytes},
                        // Reducing one Partial and keeping another: each class of the kept one
                        // reduces and delivers among itself (2x4 of 5x7 cut by elements).
                        {"2x2x2", "P(max),P(sum),S(0)", "S(0),P(sum),R", Objective::bytes},
                        {"2x4", "P(sum),P(sum)", "P(sum),S(0)", Objective::bytes}};
  const Shape shapes[] = {{16, 8}, {5, 7}};
  const DType dtypes[] = {DType::f32, DType::i64, DType::bf16};
  testing::Agreement verdicts(world_rank);
  for (const Case& c : cases) {
    const DeviceMesh mesh = parse_mesh(c.mesh);
    if (mesh.size() != world_size) continue;
    MpiBackend backend(mesh);
    for (const Shape& shape : shapes)
      for (DType dtype : dtypes) {
        // Partial(avg) needs a floating dtype.
        if (!is_floating(dtype) &&
            (std::string_view(c.from).find("avg") != std::string_view::npos ||
             std::string_view(c.to).find("avg") != std::string_view::npos))
          continue;
        const Layout src(mesh, parse_placements(c.from), shape, dtype);
        const Layout dst(mesh, parse_placements(c.to), shape, dtype);
        const std::string problem = detail::visit_dtype(dtype, [&]<class T>() {
          return testing::run_against_simulator<T>(src, dst, backend, nullptr,
                                                   {.objective = c.objective});
        });
        verdicts.agree(fmt::format("{} {} {} {} -> {}", c.mesh, shape, dtype, c.from, c.to),
                       problem.empty(), problem);
      }
  }
  // Groups that hold no element (one row sharded over mesh dim 0: the ranks of row 1 hold
  // nothing; an empty tensor): their collectives pass a count of 0, which the backend starts
  // nothing for, blocking and through execute_async; padded (one native collective) and exact.
  struct EmptyGroup {
    std::string_view mesh, from, to;
    Shape shape;
  };
  for (const EmptyGroup& c :
       {EmptyGroup{"2x4", "S(0),P", "S(0),R", {1, 8}},
        EmptyGroup{"2x4", "S(0),P", "S(0),S(1)", {1, 8}},
        EmptyGroup{"2x4", "S(0),S(1)", "S(0),R", {1, 8}},
        EmptyGroup{"2x4", "S(0),S(0)", "S(0),S(1)", {1, 8}},
        EmptyGroup{"2x4", "P,S(1)", "R,S(0)", {0, 8}}, EmptyGroup{"8", "P", "R", {0, 5}},
        EmptyGroup{"8", "S(0)", "S(1)", {8, 0}}}) {
    const DeviceMesh mesh = parse_mesh(c.mesh);
    if (mesh.size() != world_size) continue;
    MpiBackend backend(mesh);
    const Layout src(mesh, parse_placements(c.from), c.shape, DType::f32);
    const Layout dst(mesh, parse_placements(c.to), c.shape, DType::f32);
    for (const Padding padding : {Padding::always, Padding::never})
      for (const bool async : {false, true}) {
        const std::string problem = testing::run_against_simulator<float>(
            src, dst, backend, nullptr, {.padding = padding}, false, async);
        verdicts.agree(
            fmt::format("empty group {} {} {} -> {} {}{}", c.mesh, c.shape, c.from, c.to,
                        padding == Padding::always ? "padded" : "exact", async ? " async" : ""),
            problem.empty(), problem);
      }
  }
  // A collective of no element starts nothing: one rank alone passes through each.
  if (world_size == 8) {
    MpiBackend backend(parse_mesh("2x4"));
    if (world_rank == 0) {
      float x = 0;
      backend.all_gather(1, &x, &x, 0);
      backend.reduce_scatter(1, &x, &x, 0, DType::f32, ReduceOp::sum);
      backend.all_reduce(0, &x, &x, 0, DType::bf16, ReduceOp::avg);
      backend.all_to_all(1, &x, &x, 0);
      backend.all_to_all_strided(1, &x, &x, {}, {});
      backend.all_gather_strided(0, &x, &x, {});
    }
    verdicts.agree("a collective of no element starts nothing", true);
  }
  // A case of one layout pair and shape, run in f32 and bf16 against the simulator with
  // `options`; `scratch_problem(mesh, src, dst, held)` says what is wrong with the scratch held.
  struct Sized {
    std::string_view mesh, from, to;
    Shape shape;
    Objective objective = Objective::time;
  };
  auto run_sized = [&](std::string_view label, const Sized& c, const PlanOptions& options,
                       auto&& scratch_problem) {
    const DeviceMesh mesh = parse_mesh(c.mesh);
    if (mesh.size() != world_size) return;
    MpiBackend backend(mesh);
    for (DType dtype : {DType::f32, DType::bf16}) {
      const Layout src(mesh, parse_placements(c.from), c.shape, dtype);
      const Layout dst(mesh, parse_placements(c.to), c.shape, dtype);
      ExecuteStats stats;
      std::string problem = detail::visit_dtype(dtype, [&]<class T>() {
        return testing::run_against_simulator<T>(src, dst, backend, &stats, options);
      });
      if (problem.empty()) problem = scratch_problem(mesh, src, dst, stats.scratch_peak_bytes);
      verdicts.agree(
          fmt::format("{} {} {} {} {} -> {}", label, c.mesh, c.shape, dtype, c.from, c.to),
          problem.empty(), problem);
    }
  };
  // Under Memory::bounded a reduce-scatter of 4 or 8 members by messages runs in rounds, each
  // partial received into the target or the block's slot sent the round before
  // (reduces_in_rounds): after an all-to-all into scratch nothing beyond that block, which is the
  // source's size; from the source itself, into staging. Column pieces (strided) and, from
  // 1 MiB, row slabs (reduced by messages). Uneven column pieces of a max (3, 3, 3 and 1 of 10)
  // after an all-reduce into scratch: each partial received into the own piece's slot and
  // reduced into the target after its round, so again nothing beyond the block; likewise a sum
  // in f32, whose parts fold one at a time (not in bf16, which accumulates in float: one round,
  // two partials staged beside the block). An uneven exchange from a Partial (bytes objective)
  // reduces each member's part in one round per member, holding two parts (reduces_parts_in_
  // rounds; a bf16 sum in one round, the group's partials staged).
  for (const Sized& c : {Sized{"2x4", "S(0),P", "S(1),S(1)", {8, 16}},
                         Sized{"2x4", "S(1),P(max)", "S(0),S(1)", {16, 32}},
                         Sized{"2x4", "P(sum),P(max)", "R,S(1)", {7, 10}},
                         Sized{"2x4", "P(max),P(sum)", "R,S(1)", {7, 10}},
                         Sized{"2x4", "S(1),P", "R,S(1)", {7, 10}, Objective::bytes},
                         Sized{"2x4", "S(1),P(max)", "R,S(1)", {7, 10}, Objective::bytes},
                         Sized{"2x4", "S(0),P", "S(1),S(0)", {512, 1024}},
                         Sized{"8", "P", "S(1)", {16, 32}}, Sized{"8", "P", "S(0)", {256, 1024}}})
    run_sized("bounded", c, {.objective = c.objective, .memory = Memory::bounded},
              [&](const DeviceMesh& mesh, const Layout& src, const Layout& dst,
                  std::int64_t held) -> std::string {
                const std::int64_t ends =
                    std::max(src.local_bytes(world_rank), dst.local_bytes(world_rank));
                const bool bf16_sum_in_one_round =
                    src.dtype() == DType::bf16 && (c.from == "P(max),P(sum)" || c.from == "S(1),P");
                if (mesh.ndim() != 2 || held <= ends || bf16_sum_in_one_round) return "";
                return fmt::format("rank {} held {} scratch bytes, above its larger block's {}",
                                   world_rank, held, ends);
              });
  // All-to-all pieces that are not slabs of the block go from it as they lie, and those that
  // are not slabs of the target go straight where they belong, in derived datatypes
  // (StridedAllToAll), f32 and bf16: a one-step S(0) -> S(1) or S(1) -> S(0) holds no scratch
  // at all. Nor does an all-gather whose pieces lie side by side in the target
  // (StridedAllGather), a one-step S(1) -> R.
  static_assert(StridedAllToAll<MpiBackend> && StridedAllGather<MpiBackend>);
  using Strided = Sized;
  const Strided strided[] = {
      {"8", "S(0)", "S(1)", {16, 32}},      {"8", "S(1)", "S(0)", {16, 32}},
      {"8", "S(0)", "S(1)", {64, 1024}},    {"8", "S(1)", "S(0)", {64, 1024}},
      {"8", "S(0)", "S(2)", {16, 3, 16}},   {"8", "S(2)", "S(1)", {4, 16, 8}},
      {"2x4", "R,S(0)", "R,S(1)", {8, 16}}, {"2x4", "S(0),S(1)", "S(1),S(0)", {16, 16}},
      {"8", "S(1)", "R", {16, 32}},         {"8", "S(1)", "R", {64, 1024}},
      {"8", "S(2)", "R", {4, 3, 16}},       {"2x4", "S(1),S(1)", "S(1),R", {8, 64}}};
  for (const Strided& c : strided)
    run_sized("strided", c, {},
              [&](const DeviceMesh& mesh, const Layout&, const Layout&,
                  std::int64_t held) -> std::string {
                const bool one_step = mesh.ndim() == 1 && ((c.from == "S(0)" && c.to == "S(1)") ||
                                                           (c.from == "S(1)" && c.to == "S(0)") ||
                                                           (c.from == "S(1)" && c.to == "R"));
                if (!one_step || held == 0) return "";
                return fmt::format("rank {} held {} scratch bytes, none expected", world_rank,
                                   held);
              });
  // The same strided all-to-alls by single copy between the ranks' buffers
  // (MpiBackend::SingleCopy::always, from any size): strided sends written into the peers'
  // targets, strided receives read from the peers' sources; the same results as the simulator,
  // and the path taken wherever this machine lets ranks reach each other's memory. Each with
  // rows through the staging buffer, and with rows moved straight (single_copy_direct_write_ and
  // read_from_bytes 0), where strided all-gathers are read from the peers' sources too (they keep
  // their datatypes otherwise); each in one band of rows by this rank's thread alone, and in
  // bands of a few rows (single_copy_band_bytes 1000: one row per band where a row spans more)
  // shared between three threads (single_copy_threads). f32 runs blocking, bf16 through
  // execute_async.
  const Strided single[] = {
      {"8", "S(0)", "S(1)", {16, 32}},        {"8", "S(0)", "S(1)", {64, 1024}},
      {"8", "S(0)", "S(2)", {16, 3, 16}},     {"8", "S(0)", "S(1)", {13, 24}},
      {"8", "S(1)", "S(0)", {64, 1024}},      {"8", "S(2)", "S(1)", {4, 16, 8}},
      {"8", "S(1)", "R", {64, 1024}},         {"8", "S(2)", "R", {4, 3, 16}},
      {"2x4", "R,S(0)", "R,S(1)", {8, 16}},   {"2x4", "S(0),S(1)", "S(1),S(0)", {16, 16}},
      {"2x4", "S(1),S(1)", "S(1),R", {8, 64}}};
  int single_copies = 0;
  const std::size_t one_band = MpiBackend::Options{}.single_copy_band_bytes;
  for (const Strided& c : single)
    for (const std::size_t direct_from : {std::numeric_limits<std::size_t>::max(), std::size_t{0}})
      for (const std::size_t band : {one_band, std::size_t{1000}}) {
        const DeviceMesh mesh = parse_mesh(c.mesh);
        if (mesh.size() != world_size) continue;
        MpiBackend backend(mesh, MPI_COMM_WORLD,
                           {.single_copy = MpiBackend::SingleCopy::always,
                            .single_copy_from_bytes = 0,
                            .single_copy_direct_write_from_bytes = direct_from,
                            .single_copy_direct_read_from_bytes = direct_from,
                            .single_copy_band_bytes = band,
                            .single_copy_threads = band == one_band ? 1U : 3U,
                            .single_copy_threads_from_bytes = 0});
        single_copies += backend.single_copy(mesh.ndim() - 1) ? 1 : 0;
        for (DType dtype : {DType::f32, DType::bf16}) {
          const Layout src(mesh, parse_placements(c.from), c.shape, dtype);
          const Layout dst(mesh, parse_placements(c.to), c.shape, dtype);
          const bool async = dtype == DType::bf16;  // started by execute_async, polled, waited
          const std::string problem = detail::visit_dtype(dtype, [&]<class T>() {
            return testing::run_against_simulator<T>(src, dst, backend, nullptr, {}, false, async);
          });
          verdicts.agree(
              fmt::format("single copy{}{}{} {} {} {} {} -> {}",
                          direct_from == 0 ? " (rows straight)" : "",
                          band == one_band ? "" : " (bands)", async ? " (execute_async)" : "",
                          c.mesh, c.shape, dtype, c.from, c.to),
              problem.empty(), problem);
        }
      }
  if (world_rank == 0)
    fmt::print("single copy: {} of {} backends could reach their peers' memory\n", single_copies,
               4 * std::size(single));
  // The threads of a large single copy: as given, or by default as many as this rank has
  // cores of its own (1 when 8 ranks share fewer than 16 CPUs), at most 8.
  {
    const DeviceMesh mesh({world_size});
    const MpiBackend given(mesh, MPI_COMM_WORLD, {.single_copy_threads = 5});
    const MpiBackend automatic(mesh);
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    const unsigned threads = automatic.single_copy_threads();
    verdicts.agree("single copy threads as given", given.single_copy_threads() == 5,
                   fmt::format("{} threads, 5 given", given.single_copy_threads()));
    verdicts.agree("single copy threads by default",
                   threads >= 1 && threads <= 8 && (cpus / world_size > 1 || threads == 1),
                   fmt::format("{} threads on {} CPUs for {} ranks", threads, cpus, world_size));
  }
  // Gradients all-reduced in place (source and target one buffer), by MPI_IN_PLACE and by
  // messages, f32 and bf16.
  for (const std::size_t by_messages : {std::numeric_limits<std::size_t>::max(), std::size_t{0}})
    for (const auto& [m, from, to] :
         {std::tuple{"8", "P", "R"}, std::tuple{"2x4", "R,P(avg)", "R,R"},
          std::tuple{"2x4", "P(max),R", "R,R"}}) {
      const DeviceMesh mesh = parse_mesh(m);
      if (mesh.size() != world_size) continue;
      MpiBackend backend(mesh, MPI_COMM_WORLD, {.reduce_by_messages_from_bytes = by_messages});
      for (DType dtype : {DType::f32, DType::bf16}) {
        const Layout src(mesh, parse_placements(from), {24, 40}, dtype);
        const Layout dst(mesh, parse_placements(to), {24, 40}, dtype);
        const std::string problem = detail::visit_dtype(dtype, [&]<class T>() {
          return testing::run_against_simulator<T>(src, dst, backend, nullptr, {}, true);
        });
        verdicts.agree(fmt::format("in place {} {} {} -> {}", m, dtype, from, to), problem.empty(),
                       problem);
      }
    }
  // An all-gather in place (each rank's source at its slab of the target, MPI_IN_PLACE's
  // layout), blocking and started, on 8 and on 2x4's mesh dim 1, by messages (the default at
  // this size) and by MPI_Iallgather.
  for (const std::size_t below : {MpiBackend::move_messages_bytes, std::size_t{0}})
    for (const auto& [m, from] : {std::pair{"8", "S(0)"}, std::pair{"2x4", "R,S(0)"}}) {
      const DeviceMesh mesh = parse_mesh(m);
      if (mesh.size() != world_size) continue;
      MpiBackend backend(mesh, MPI_COMM_WORLD, {.move_by_messages_below_bytes = below});
      const Layout src(mesh, parse_placements(from), {64, 40}, DType::f32);
      const Layout dst =
          src.with_placements(Placements(static_cast<std::size_t>(mesh.ndim()), Replicate()));
      const Plan plan = plan_redistribute(src, dst);
      for (const bool async : {false, true}) {
        const std::vector<float> mine = global_view_block<float>(src, world_rank);
        const std::vector<float> want = global_view_block<float>(dst, world_rank);
        std::vector<float> buffer(want.size(), -1.0f);
        const std::size_t slot =
            static_cast<std::size_t>(mesh.coordinate(world_rank).back()) * mine.size();
        std::copy(mine.begin(), mine.end(), buffer.begin() + static_cast<std::ptrdiff_t>(slot));
        std::string problem;
        try {
          if (async)
            execute_async(plan, backend, buffer.data() + slot, mine.size() * 4, buffer.data(),
                          buffer.size() * 4)
                .wait();
          else
            execute(plan, backend, buffer.data() + slot, mine.size() * 4, buffer.data(),
                    buffer.size() * 4);
          if (buffer != want) problem = "values differ";
        } catch (const std::exception& e) {
          problem = e.what();
        }
        verdicts.agree(fmt::format("all-gather in place {} {} (async {}, {})", m, from, async,
                                   below == 0 ? "MPI_Iallgather" : "by messages"),
                       problem.empty(), problem);
      }
    }
  // A bad argument is an exception, not an abort: a mesh that is not the world.
  bool refused = false;
  try {
    MpiBackend wrong(DeviceMesh({world_size + 1}));
  } catch (const error&) {
    refused = true;
  }
  verdicts.agree("a mesh that is not the world refused", refused);
  if (world_rank == 0)
    fmt::print("mpi_execute: {} passed, {} failed\n", verdicts.passed(), verdicts.failed());
  MPI_Finalize();
  return verdicts.failed() == 0 ? 0 : 1;
}
