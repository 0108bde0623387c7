// The device data path against the host's: kernels byte for byte against HostOps, and the
// global-view oracle on the device-memory simulated backend, whose results must equal the host
// simulator's bit for bit (same steps, same reduction order, same arithmetic).
#include <catch2/catch.hpp>

#include <dtensor/cuda/check.hpp>
#include <dtensor/dtensor.hpp>
#include <dtensor/execute.hpp>
#include <dtensor/verify.hpp>

#include <fmt/core.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "../placement_pairs.hpp"
#include "../random_redistribution.hpp"
#include "gpu.hpp"

using namespace dtensor;
namespace gpu = dtensor::testing::gpu;

namespace {

// A device buffer for the tests, freed synchronously.
struct DeviceBuffer {
  void* p = nullptr;
  std::size_t n = 0;
  explicit DeviceBuffer(std::size_t bytes) : n(bytes) {
    cuda::check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(p); }
  void upload(const std::vector<std::byte>& v) {
    cuda::check(cudaMemcpy(p, v.data(), v.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  std::vector<std::byte> download() const {
    std::vector<std::byte> v(n);
    cuda::check(cudaMemcpy(v.data(), p, n, cudaMemcpyDeviceToHost), "cudaMemcpy");
    return v;
  }
};

std::vector<std::byte> random_bytes(std::size_t n, std::mt19937_64& rng) {
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng() & 0xff);
  return v;
}

// Values that exercise every branch of the arithmetic: NaN, infinities, extremes, zeros.
template <class T>
std::vector<T> awkward_values(std::size_t n, std::mt19937_64& rng) {
  using C = detail::compute_t<T>;
  std::vector<T> v(n);
  std::uniform_real_distribution<double> u(-100, 100);
  for (std::size_t i = 0; i < n; ++i) {
    C x = static_cast<C>(u(rng));
    switch (i % 9) {
      case 0:
        if constexpr (std::numeric_limits<C>::has_quiet_NaN)
          x = std::numeric_limits<C>::quiet_NaN();
        break;
      case 1:
        if constexpr (std::numeric_limits<C>::has_infinity) x = std::numeric_limits<C>::infinity();
        break;
      case 2: x = std::numeric_limits<C>::max(); break;
      case 3: x = std::numeric_limits<C>::lowest(); break;
      case 4: x = C(0); break;
      default: break;
    }
    v[i] = detail::narrow<T>(x);
  }
  return v;
}

// Equal element by element, bits or NaN for NaN: a GPU makes canonical NaNs where the host
// keeps an operand's payload.
template <class T>
bool same_values(const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); i += sizeof(T)) {
    if (std::memcmp(a.data() + i, b.data() + i, sizeof(T)) == 0) continue;
    T x, y;
    std::memcpy(&x, a.data() + i, sizeof(T));
    std::memcpy(&y, b.data() + i, sizeof(T));
    const double u = double(detail::widen(x)), v = double(detail::widen(y));
    if (!(std::isnan(u) && std::isnan(v))) return false;
  }
  return true;
}

template <class T>
std::vector<std::byte> as_bytes(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace

TEST_CASE("copy_box on the device equals the host's, for every shape and element size",
          "[cuda][kernels]") {
  std::mt19937_64 rng(7);
  const HostOps host;
  int cases = 0;
  for (int round = 0; round < 400; ++round) {
    const int nd = 1 + static_cast<int>(rng() % 4);
    const std::size_t elem = std::size_t{1} << (rng() % 4);
    Shape src_shape, dst_shape, src_at, dst_at, extent;
    for (int d = 0; d < nd; ++d) {
      const std::int64_t e = 1 + static_cast<std::int64_t>(rng() % (d == nd - 1 ? 70 : 9));
      extent.push_back(e);
      const std::int64_t a = static_cast<std::int64_t>(rng() % 3),
                         b = static_cast<std::int64_t>(rng() % 3);
      // Often whole in one buffer or both, so that dims merge and vectors widen.
      const bool whole_src = rng() % 2 == 0, whole_dst = rng() % 2 == 0;
      src_at.push_back(whole_src ? 0 : a);
      dst_at.push_back(whole_dst ? 0 : b);
      src_shape.push_back(whole_src ? e : e + a + static_cast<std::int64_t>(rng() % 3));
      dst_shape.push_back(whole_dst ? e : e + b + static_cast<std::int64_t>(rng() % 3));
    }
    auto numel = [](const Shape& s) {
      std::size_t n = 1;
      for (auto e : s) n *= static_cast<std::size_t>(e);
      return n;
    };
    const auto src = random_bytes(numel(src_shape) * elem, rng);
    auto want = random_bytes(numel(dst_shape) * elem, rng);
    DeviceBuffer dsrc(src.size()), ddst(want.size());
    dsrc.upload(src);
    ddst.upload(want);
    host.copy_box(src.data(), src_shape, src_at, want.data(), dst_shape, dst_at, extent, elem);
    gpu::copy_box(dsrc.p, src_shape, src_at, ddst.p, dst_shape, dst_at, extent, elem);
    INFO(fmt::format("extent {} elem {} src {} at {} dst {} at {}", extent, elem, src_shape, src_at,
                     dst_shape, dst_at));
    CHECK(ddst.download() == want);
    ++cases;
  }
  CHECK(cases == 400);
}

TEST_CASE("pack_pieces and unpack_pieces on the device equal the host's", "[cuda][kernels]") {
  std::mt19937_64 rng(9);
  const HostOps host;
  // Random small blocks, then blocks with many narrow rows (moved in tiles, with a rest).
  struct Fixed {
    Shape shape;
    int dim, g;
    std::size_t elem;
  };
  const Fixed fixed[] = {{{(1 << 21) + 3, 24}, 1, 8, 2},  // 96 MiB: beyond L2, so in tiles
                         {{4099, 24}, 1, 8, 2},          {{1000, 56}, 1, 8, 4},
                         {{3, 700, 6}, 2, 2, 8},         {{20000, 8}, 1, 4, 1},
                         {{7, 300, 16, 2}, 2, 16, 2}};
  for (int round = 0; round < 206; ++round) {
    const int nd = 1 + static_cast<int>(rng() % 4);
    int dim = static_cast<int>(rng() % static_cast<unsigned>(nd));
    int g = 1 + static_cast<int>(rng() % 8);
    std::size_t elem = std::size_t{1} << (rng() % 4);
    Shape shape;
    for (int d = 0; d < nd; ++d)
      shape.push_back((d == dim ? g : 1) * (1 + static_cast<std::int64_t>(rng() % 9)));
    if (round >= 200) {
      const Fixed& f = fixed[round - 200];
      shape = f.shape, dim = f.dim, g = f.g, elem = f.elem;
    }
    std::size_t numel = 1;
    for (std::int64_t e : shape) numel *= static_cast<std::size_t>(e);
    INFO(fmt::format("shape {} dim {} g {} elem {}", shape, dim, g, elem));
    const auto block = random_bytes(numel * elem, rng);
    std::vector<std::byte> packed(block.size()), unpacked(block.size());
    host.pack_pieces(block.data(), shape, dim, g, packed.data(), elem);
    host.unpack_pieces(packed.data(), unpacked.data(), shape, dim, g, elem);
    CHECK(unpacked == block);
    DeviceBuffer dblock(block.size()), dpacked(block.size());
    dblock.upload(block);
    gpu::pack_pieces(dblock.p, shape, dim, g, dpacked.p, elem);
    CHECK(dpacked.download() == packed);
    dblock.upload(std::vector<std::byte>(block.size()));
    gpu::unpack_pieces(dpacked.p, dblock.p, shape, dim, g, elem);
    CHECK(dblock.download() == block);
  }
}

TEST_CASE("copy_runs on the device equals the host's, one launch for many copies",
          "[cuda][kernels]") {
  // Copies of every alignment (odd runs and strides, 16-byte rows), plain and strided, more
  // than one launch holds; each writes its own part of the destination.
  std::mt19937_64 rng(7);
  for (std::size_t count : {std::size_t{1}, std::size_t{37}, std::size_t{600}}) {
    const std::size_t src_bytes = 1 << 20;
    const auto src = random_bytes(src_bytes, rng);
    std::vector<RunCopy> host_copies, device_copies;
    std::vector<std::size_t> src_at, dst_at;
    std::size_t dst_bytes = 0;
    auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
    for (std::size_t i = 0; i < count; ++i) {
      const std::size_t unit = std::size_t{1} << pick(5);  // 1 to 16 bytes
      RunCopy c;
      c.rows = 1 + pick(4) * pick(20);
      c.run_bytes = unit * (1 + pick(40));
      c.src_stride = c.run_bytes + unit * pick(3);
      c.dst_stride = c.run_bytes + unit * pick(2);
      const std::size_t src_span = (c.rows - 1) * c.src_stride + c.run_bytes;
      src_at.push_back(unit * pick((src_bytes - src_span) / unit));
      dst_at.push_back(dst_bytes);
      dst_bytes += ((c.rows - 1) * c.dst_stride + c.run_bytes + 15) / 16 * 16 + unit * pick(2);
      host_copies.push_back(c);
    }
    std::vector<std::byte> want(dst_bytes, std::byte{0x5a});
    DeviceBuffer dsrc(src_bytes), ddst(dst_bytes);
    dsrc.upload(src);
    ddst.upload(want);
    device_copies = host_copies;
    for (std::size_t i = 0; i < count; ++i) {
      host_copies[i].src = src.data() + src_at[i];
      host_copies[i].dst = want.data() + dst_at[i];
      device_copies[i].src = static_cast<const std::byte*>(dsrc.p) + src_at[i];
      device_copies[i].dst = static_cast<std::byte*>(ddst.p) + dst_at[i];
    }
    copy_runs(HostOps{}, std::span<const RunCopy>(host_copies));
    gpu::copy_runs(device_copies);
    CHECK(ddst.download() == want);
  }
}

TEST_CASE("fill, scale and reduce on the device equal the host's bit for bit", "[cuda][kernels]") {
  std::mt19937_64 rng(11);
  const HostOps host;
  const std::size_t n = 1000;
  for (DType dtype : all_dtypes) {
    detail::visit_dtype(dtype, [&]<class T>() {
      for (ReduceOp op :
           {ReduceOp::sum, ReduceOp::avg, ReduceOp::product, ReduceOp::max, ReduceOp::min}) {
        INFO(fmt::format("{} {}", dtype, op));
        // fill_identity
        {
          std::vector<std::byte> want(n * sizeof(T));
          host.fill_identity(dtype, want.data(), n, op);
          DeviceBuffer d(want.size());
          gpu::fill_identity(dtype, d.p, n, op);
          CHECK(d.download() == want);
        }
        // reduce of 1, 3 and 8 parts, the output aliasing the first part
        for (int g : {1, 3, 8}) {
          std::vector<std::vector<std::byte>> parts;
          for (int j = 0; j < g; ++j) parts.push_back(as_bytes(awkward_values<T>(n, rng)));
          std::vector<std::unique_ptr<DeviceBuffer>> dparts;
          std::vector<const void*> hp, dp;
          for (int j = 0; j < g; ++j) {
            dparts.push_back(
                std::make_unique<DeviceBuffer>(parts[static_cast<std::size_t>(j)].size()));
            dparts.back()->upload(parts[static_cast<std::size_t>(j)]);
            hp.push_back(parts[static_cast<std::size_t>(j)].data());
            dp.push_back(dparts.back()->p);
          }
          host.reduce(dtype, parts[0].data(), std::span<const void* const>(hp.data(), hp.size()), n,
                      op);
          gpu::reduce(dtype, dparts[0]->p, std::span<const void* const>(dp.data(), dp.size()), n,
                      op);
          CHECK(same_values<T>(dparts[0]->download(), parts[0]));
        }
      }
      // divide and multiply
      for (int g : {1, 2, 3, 8}) {
        auto values = as_bytes(awkward_values<T>(n, rng));
        DeviceBuffer d(values.size());
        d.upload(values);
        auto want = values;
        host.divide(dtype, want.data(), n, g);
        gpu::divide(dtype, d.p, n, g);
        CHECK(same_values<T>(d.download(), want));
        d.upload(values);
        want = values;
        host.multiply(dtype, want.data(), n, g);
        gpu::multiply(dtype, d.p, n, g);
        CHECK(same_values<T>(d.download(), want));
      }
    });
  }
}

TEST_CASE("a block moves in place into a larger one around it on the device as on the host",
          "[cuda][kernels]") {
  // cuda::fill_around_in_place (a launch per detail::expand_moves move, then the identity)
  // against HostOps's, every dtype and op, on random boxes of 1 to 4 dims (empty ones, whole
  // trailing dims and rows that overlap their own places among them) and on a block of a
  // million elements.
  std::mt19937_64 rng(13);
  const HostOps host;
  for (int trial = 0; trial < 600; ++trial) {
    const int nd = 1 + trial % 4;
    Shape outer, inner, at;
    for (int d = 0; d < nd; ++d) {
      outer.push_back(static_cast<std::int64_t>(rng() % (nd == 1 ? 41 : 10)));
      inner.push_back(static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(outer[d] + 1)));
      if (trial % 3 == 0 && d > 0) inner[d] = outer[d];
      at.push_back(
          static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(outer[d] - inner[d] + 1)));
    }
    if (trial == 0) outer = {2048, 1024}, inner = {2048, 341}, at = {0, 683};
    const DType dtype = all_dtypes[static_cast<std::size_t>(trial) % std::size(all_dtypes)];
    const ReduceOp op = trial % 2 == 0 ? ReduceOp::sum : ReduceOp::max;
    std::size_t count = 1;
    for (std::int64_t e : outer) count *= static_cast<std::size_t>(e);
    std::vector<std::byte> want = random_bytes(count * size_of(dtype), rng);
    DeviceBuffer d(want.size());
    d.upload(want);
    INFO(fmt::format("{} {}: inner {} at {} in {}", dtype, op, inner, at, outer));
    host.fill_around_in_place(dtype, want.data(), inner, outer, at, op);
    gpu::fill_around_in_place(dtype, d.p, inner, outer, at, op);
    CHECK(d.download() == want);
  }
}

namespace {

struct Tally {
  int runs = 0, failures = 0;
  void add(bool ok, const std::string& what) {
    ++runs;
    if (!ok && ++failures <= 10) FAIL_CHECK(what);
  }
};

// The device run passes the global-view check and equals the host run byte for byte.
void check_case(Tally& tally, const Layout& src, const Layout& dst, const PlanOptions& options,
                const std::string& what) {
  // DTENSOR_TRACE=1 names each case before it runs (for a crash's last words).
  static const bool trace = std::getenv("DTENSOR_TRACE") != nullptr;
  if (trace) std::fprintf(stderr, "case %s\n", what.c_str());
  const Plan plan = plan_redistribute(src, dst, options);
  const Verification device = gpu::verify(plan);
  if (!device.verified) {
    tally.add(false, what + ": " + device.difference);
    return;
  }
  const Verification host = verify_on_simulator(plan);
  tally.add(host.results == device.results, what + ": device and host results differ");
}

}  // namespace

TEST_CASE("the global view on device memory: the planner's matrix", "[cuda][oracle]") {
  const Placement options[] = {Replicate(), Shard(0), Shard(1), Partial(), Partial(ReduceOp::max)};
  const DeviceMesh meshes[] = {DeviceMesh({4}), DeviceMesh({2, 2}), DeviceMesh({2, 4}),
                               DeviceMesh({2, 2, 2})};
  const Shape shapes[] = {{16, 8}, {5, 7}};
  Tally tally;
  for (const DeviceMesh& m : meshes) {
    testing::for_each_pair(m, options, [&](int x, int y, const Placements& a, const Placements& b) {
      // The 2x2x2 matrix is large: a fixed sample of it.
      if (m.ndim() == 3 && (x * 131 + y) % 11 != 0) return;
      for (const Shape& shape : shapes) {
        std::vector<DType> dtypes{DType::f32};
        if ((x + y) % 3 == 0) dtypes.push_back(DType::bf16);
        if ((x + y) % 3 == 1) dtypes.push_back(DType::i64);
        // The memory bound: steps in bands and in rounds, packed on the device (no strided
        // messages), one piece or one peer at a time.
        std::vector<PlanOptions> variants{{}, PlanOptions{.memory = Memory::bounded}};
        // Uneven: padded and exact pieces, and the fewest bytes (exchanges from a Partial cut by
        // elements, row-major or by columns).
        if (shape[0] == 5)
          variants.insert(variants.end(), {PlanOptions{.padding = Padding::always},
                                           PlanOptions{.padding = Padding::never},
                                           PlanOptions{.objective = Objective::bytes}});
        for (DType dtype : dtypes)
          for (const PlanOptions& variant : variants) {
            if (dtype != DType::f32 &&
                (variant.padding != Padding::automatic || variant.memory == Memory::bounded))
              continue;
            check_case(
                tally, Layout(m, a, shape, dtype), Layout(m, b, shape, dtype), variant,
                fmt::format("{} {} {} {} -> {} padding {} objective {} memory {}", m, shape, dtype,
                            a, b, static_cast<int>(variant.padding),
                            static_cast<int>(variant.objective), static_cast<int>(variant.memory)));
          }
      }
    });
  }
  fmt::print("device global-view oracle: {} runs, {} failed\n", tally.runs, tally.failures);
  CHECK(tally.failures == 0);
}

TEST_CASE("the global view on device memory in every dtype and reduce op", "[cuda][oracle]") {
  const Placement options[] = {Replicate(),
                               Shard(0),
                               Shard(1),
                               Partial(),
                               Partial(ReduceOp::max),
                               Partial(ReduceOp::avg),
                               Partial(ReduceOp::min)};
  Tally tally;
  const DeviceMesh m({2, 2});
  testing::for_each_pair(m, options, [&](int x, int y, const Placements& a, const Placements& b) {
    for (DType dtype : all_dtypes) {
      if ((x + y + static_cast<int>(dtype)) % 4 != 0) continue;
      if (!testing::placements_fit(a, dtype) || !testing::placements_fit(b, dtype)) continue;
      const Shape shape = (x + y) % 2 ? Shape{5, 7} : Shape{8, 8};
      check_case(tally, Layout(m, a, shape, dtype), Layout(m, b, shape, dtype), {},
                 fmt::format("{} {} {} {} -> {}", m, shape, dtype, a, b));
    }
  });
  fmt::print("device global-view oracle, every dtype: {} runs, {} failed\n", tally.runs,
             tally.failures);
  CHECK(tally.failures == 0);
}

TEST_CASE("a large redistribution on device memory, checked against the host", "[cuda][oracle]") {
  // Megatron-sized blocks: vector-width copies, multi-block kernels, big staging.
  const DeviceMesh m({2, 4});
  Tally tally;
  const Placements from[] = {Placements{Shard(0), Replicate()}, Placements{Partial(), Shard(1)},
                             Placements{Shard(1), Shard(0)}};
  const Placements to[] = {Placements{Replicate(), Shard(1)}, Placements{Shard(0), Shard(0)},
                           Placements{Shard(0), Shard(1)}};
  for (int i = 0; i < 3; ++i) {
    const Placements& a = from[i];
    const Placements& b = to[i];
    check_case(tally, Layout(m, a, {1000, 1030}, DType::bf16),
               Layout(m, b, {1000, 1030}, DType::bf16), {},
               fmt::format("{} -> {} on 1000x1030 bf16", a, b));
  }
  CHECK(tally.failures == 0);
}

TEST_CASE("batches of 1 to 16 mixed tensors on device memory equal the host's", "[cuda][batch]") {
  // Every tensor's packing and unpacking, the fused rounds and their staging on the device, for
  // both schedules: each tensor passes the global-view check, and equals the host simulator's
  // run bit for bit, with the same bytes and the same backend calls.
  std::mt19937 rng(20261126);
  const DeviceMesh meshes[] = {DeviceMesh({4}), DeviceMesh({2, 2}), DeviceMesh({2, 4}),
                               DeviceMesh({2, 2, 2})};
  Tally tally;
  std::int64_t calls = 0;
  for (const DeviceMesh& mesh : meshes)
    for (int size : {1, 2, 5, 16})
      for (int repeat = 0; repeat < 3; ++repeat) {
        std::vector<Redistribution> tensors;
        for (int t = 0; t < size; ++t) tensors.push_back(testing::random_redistribution(rng, mesh));
        for (BatchSchedule schedule : {BatchSchedule::fused, BatchSchedule::fewest_calls}) {
          const BatchPlan<16> batch = plan_batch<16>(tensors, {}, schedule);
          const std::string what =
              fmt::format("mesh {} batch of {} (repeat {}, schedule {})", mesh.shape(), size,
                          repeat, static_cast<int>(schedule));
          const BatchVerification device = gpu::verify_batch(batch);
          if (!device.verified) {
            tally.add(false, what + ": " + device.difference);
            continue;
          }
          const BatchVerification host = verify_batch_on_simulator(batch);
          bool same = host.collectives == device.collectives && host.measured == device.measured;
          for (std::size_t t = 0; t < batch.size(); ++t)
            same = same && host.tensors[t].results == device.tensors[t].results;
          tally.add(same, what + ": device and host runs differ");
          calls += device.collectives;
        }
      }
  fmt::print("device batches: {} runs, {} backend calls, {} failed\n", tally.runs, calls,
             tally.failures);
  CHECK(tally.failures == 0);
}

TEST_CASE("device runs reject bad input with a named error", "[cuda][errors]") {
  const DeviceMesh m({2});
  const Plan plan = plan_redistribute(Layout(m, {Shard(0)}, {8, 8}, DType::f32),
                                      Layout(m, {Replicate()}, {8, 8}, DType::f32));
  CHECK_THROWS_WITH(gpu::run_with_sizes(plan, 4 * 8 * 4, 8),
                    Catch::Contains("target buffer holds 8 bytes"));
  CHECK_THROWS_WITH(gpu::reduce(DType::f32, nullptr, {}, 4, ReduceOp::sum),
                    Catch::Contains("1 to 256 parts"));
}
