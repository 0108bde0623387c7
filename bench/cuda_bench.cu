// GPU benchmarks of the device data path (one GPU):
//  1. pack and unpack of a step's g pieces (cuda::pack_pieces / unpack_pieces, one launch, as
//     execute() issues them) against cudaMemcpyAsync device-to-device of the same bytes;
//  2. the host time execute() takes to enqueue one plan step: the library's own work (step
//     bookkeeping, staging from the stream-ordered allocator, pack/unpack launches) with the
//     collective itself left out, and beside it the enqueue time of NCCL's call on a
//     one-rank communicator;
//  3. 64 small tensors batched against one by one: host time, and wall time on 8 simulated
//     ranks sharing the GPU.
// Prints Markdown tables. Usage: bench_cuda [iterations]
#include <cuda_runtime.h>

#include <dtensor/backend/nccl.cuh>
#include <dtensor/backend/simulated_device.cuh>
#include <dtensor/batch_plan.hpp>
#include <dtensor/cuda/check.hpp>
#include <dtensor/cuda/device_ops.cuh>
#include <dtensor/execute.hpp>
#include <dtensor/execute_batch.hpp>
#include <dtensor/parse.hpp>
#include <dtensor/planner.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

using namespace dtensor;

namespace {

int iterations = 20;

// Median device time in ms of `enqueue` on `stream`, after a warm-up.
template <class F>
float device_ms(cudaStream_t stream, F&& enqueue) {
  cudaEvent_t start, stop;
  cuda::check(cudaEventCreate(&start), "cudaEventCreate");
  cuda::check(cudaEventCreate(&stop), "cudaEventCreate");
  enqueue();
  std::vector<float> times;
  for (int i = 0; i < iterations; ++i) {
    cuda::check(cudaEventRecord(start, stream), "cudaEventRecord");
    enqueue();
    cuda::check(cudaEventRecord(stop, stream), "cudaEventRecord");
    cuda::check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    cuda::check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct PackCase {
  const char* name;
  std::int64_t cols;  // row length of the block, in elements
  std::size_t elem;
  int g;  // pieces along the columns
};

void pack_table(cudaStream_t stream) {
  std::printf(
      "| case | size | memcpy GB/s | pack GB/s | unpack GB/s | pack / memcpy | unpack / "
      "memcpy |\n|---|---|---|---|---|---|---|\n");
  const PackCase cases[] = {{"S(1) pieces of 1024 bf16 (2 KiB rows)", 8192, 2, 8},
                            {"S(1) pieces of 24 bf16 (48 B rows)", 192, 2, 8},
                            {"S(1) pieces of 7 f32 (28 B rows)", 56, 4, 8},
                            {"S(1) pieces of 3 bf16 (6 B rows)", 24, 2, 8}};
  const cuda::DeviceOps ops(stream);
  for (const PackCase& c : cases) {
    for (std::int64_t mib : {1, 16, 64, 256}) {
      const std::int64_t bytes = mib << 20;
      const std::int64_t rows = bytes / (c.cols * static_cast<std::int64_t>(c.elem));
      const std::int64_t total = rows * c.cols * static_cast<std::int64_t>(c.elem);
      auto block = ops.allocate(static_cast<std::size_t>(total), true);
      auto packed = ops.allocate(static_cast<std::size_t>(total), true);
      const Shape block_shape{rows, c.cols};
      auto pack = [&] {
        ops.pack_pieces(block.data(), block_shape, 1, c.g, packed.data(), c.elem);
      };
      auto unpack = [&] {
        ops.unpack_pieces(packed.data(), block.data(), block_shape, 1, c.g, c.elem);
      };
      auto memcpy = [&] { ops.copy(packed.data(), block.data(), static_cast<std::size_t>(total)); };
      const float p = device_ms(stream, pack), u = device_ms(stream, unpack),
                  m = device_ms(stream, memcpy);
      // GB/s as nvbandwidth and cudaMemcpy benchmarks count: bytes copied / time.
      auto gbs = [&](float ms) { return double(total) / (ms * 1e-3) / 1e9; };
      std::printf("| %s | %lld MiB | %.0f | %.0f | %.0f | %.2f | %.2f |\n", c.name,
                  static_cast<long long>(mib), gbs(m), gbs(p), gbs(u), m / p, m / u);
    }
  }
}

}  // namespace

namespace bench {

// A backend for one rank whose collectives do nothing: what is left of execute() is the
// library's own host work.
class NoCollectives {
 public:
  static constexpr MemorySpace memory = MemorySpace::device;
  NoCollectives(const DeviceMesh& mesh, cudaStream_t stream) : mesh_(mesh), stream_(stream) {}
  int rank() const { return mesh_.rank_at(0); }
  const DeviceMesh& mesh() const { return mesh_; }
  cuda::DeviceOps local_ops() const { return cuda::DeviceOps(stream_); }
  void all_gather(int, const void*, void*, std::size_t) {}
  void reduce_scatter(int, const void*, void*, std::size_t, DType, ReduceOp) {}
  void all_reduce(int, const void*, void*, std::size_t, DType, ReduceOp) {}
  void all_to_all(int, const void*, void*, std::size_t) {}
  void exchange(std::span<const SendMessage>, std::span<const RecvMessage>) {}

 private:
  DeviceMesh mesh_;
  cudaStream_t stream_;
};

}  // namespace bench

namespace {

template <class F>
double host_us(cudaStream_t stream, F&& enqueue) {
  const int calls = 200;
  std::vector<double> per_call;
  for (int round = 0; round < 5; ++round) {
    cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) enqueue();
    const auto stop = std::chrono::steady_clock::now();
    per_call.push_back(std::chrono::duration<double, std::micro>(stop - start).count() / calls);
  }
  cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

void overhead_table(cudaStream_t stream) {
  // Keep freed staging in the pool between runs, as a training loop would.
  cudaMemPool_t pool;
  int device = 0;
  cuda::check(cudaGetDevice(&device), "cudaGetDevice");
  cuda::check(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool");
  std::uint64_t keep = UINT64_MAX;
  cuda::check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
              "cudaMemPoolSetAttribute");
  std::printf("\n| mesh | from → to | step | host µs per execute() |\n|---|---|---|---|\n");
  struct Case {
    const char* name;
    Placement from, to;
  };
  const DeviceMesh mesh({8});
  const Shape shape{1024, 4096};
  const Case cases[] = {{"S(0) → R", Shard(0), Replicate()}, {"S(1) → R", Shard(1), Replicate()},
                        {"S(0) → S(1)", Shard(0), Shard(1)}, {"P → S(0)", Partial(), Shard(0)},
                        {"P → R", Partial(), Replicate()},   {"R → S(1)", Replicate(), Shard(1)}};
  bench::NoCollectives backend(mesh, stream);
  const cuda::DeviceOps ops(stream);
  for (const Case& c : cases) {
    const Layout src(mesh, {c.from}, shape, DType::bf16), dst(mesh, {c.to}, shape, DType::bf16);
    const Plan plan = plan_redistribute(src, dst);
    const auto src_bytes = static_cast<std::size_t>(src.local_numel(0) * 2);
    const auto dst_bytes = static_cast<std::size_t>(dst.local_numel(0) * 2);
    auto in = ops.allocate(src_bytes, true), out = ops.allocate(dst_bytes, true);
    const double us = host_us(
        stream, [&] { execute(plan, backend, in.data(), src_bytes, out.data(), dst_bytes); });
    std::printf("| 8 | %s | %s | %.1f |\n", c.name,
                plan.empty() ? "none" : std::string(name(plan[0].kind)).c_str(), us);
  }
  // NCCL's own enqueue cost, for scale: one rank, so no peer traffic.
  NcclComm world(nccl_unique_id(), 1, 0);
  NcclBackend nccl(world.get(), DeviceMesh({1}), stream);
  auto a = ops.allocate(1 << 20, true), b = ops.allocate(1 << 20, true);
  const double ag = host_us(stream, [&] { nccl.all_gather(0, a.data(), b.data(), 1 << 20); });
  const double ar = host_us(stream, [&] {
    nccl.all_reduce(0, a.data(), b.data(), (1 << 20) / 4, DType::f32, ReduceOp::sum);
  });
  std::printf(
      "\nNCCL enqueue on a one-rank communicator: ncclAllGather %.1f µs, ncclAllReduce "
      "%.1f µs per call.\n",
      ag, ar);
}

// 64 tensors (f32 and bf16, [rows, 16]) of 4 KiB to 256 KiB per rank on the larger side, as
// bench_mpi_batch builds them: one execute(BatchPlan) against one execute(Plan) per tensor.
// Host time on NoCollectives (the library's own work per batch), and the wall time of the whole
// batch on 8 simulated ranks sharing this GPU (device copies, packing, reduction kernels; each
// backend call a rendezvous of the ranks' threads).
void batch_table(cudaStream_t stream) {
  struct Pattern {
    const char* name;
    const char* mesh;
    const char* from;
    const char* to;
  };
  const Pattern patterns[] = {{"all-gather", "8", "S(0)", "R"},
                              {"reduce-scatter", "8", "P", "S(0)"},
                              {"all-reduce (2x4)", "2x4", "P,R", "R,R"},
                              {"all-to-all", "8", "S(0)", "S(1)"}};
  constexpr std::size_t tensors = 64;
  std::printf(
      "\n| pattern | collectives per rank, batched / one by one | host µs one by one | host µs "
      "batched | "
      "8 ranks on one GPU, one by one ms | batched ms |\n|---|---|---|---|---|---|\n");
  for (const Pattern& p : patterns) {
    const DeviceMesh mesh = parse_mesh(p.mesh);
    std::vector<Redistribution> batch;
    for (std::size_t t = 0; t < tensors; ++t) {
      const std::int64_t bytes = std::int64_t{4096} << (t % 7);
      const DType dtype = t % 2 == 0 ? DType::f32 : DType::bf16;
      const std::int64_t row_bytes = 16 * static_cast<std::int64_t>(size_of(dtype));
      const std::int64_t rows = std::max<std::int64_t>(bytes / row_bytes / 8 * 8, 8);
      batch.push_back({Layout(mesh, parse_placements(p.from), {rows, 16}, dtype),
                       Layout(mesh, parse_placements(p.to), {rows, 16}, dtype)});
    }
    const auto plan = std::make_unique<BatchPlan<tensors>>(plan_batch<tensors>(batch));
    std::vector<Plan> singles;
    std::int64_t calls_alone = 0;
    for (const Redistribution& r : batch) {
      singles.push_back(plan_redistribute(r.src, r.dst));
      for (const Step& step : singles.back()) calls_alone += detail::communicates(step) ? 1 : 0;
    }
    // Host work on rank 0 with collectives that do nothing.
    bench::NoCollectives none(mesh, stream);
    const cuda::DeviceOps ops(stream);
    std::vector<cuda::DeviceOps::Buffer> in, out;
    std::vector<TensorBuffers> buffers;
    for (const Redistribution& r : batch) {
      const auto sb = static_cast<std::size_t>(r.src.local_bytes(mesh.rank_at(0)));
      const auto db = static_cast<std::size_t>(r.dst.local_bytes(mesh.rank_at(0)));
      in.push_back(ops.allocate(sb, true));
      out.push_back(ops.allocate(db, true));
      buffers.push_back({in.back().data(), sb, out.back().data(), db});
    }
    const double one_us = host_us(stream, [&] {
      for (std::size_t t = 0; t < tensors; ++t)
        execute(singles[t], none, buffers[t].src, buffers[t].src_bytes, buffers[t].dst,
                buffers[t].dst_bytes);
    });
    const double batched_us =
        host_us(stream, [&] { execute(*plan, none, std::span<const TensorBuffers>(buffers)); });
    // The whole batch on 8 ranks of one GPU, wall time (median of `iterations` runs).
    auto world_ms = [&](bool batched) {
      DeviceSimulatedWorld world(mesh);
      std::vector<double> times;
      world.run([&](DeviceSimulatedBackend& b) {
        const int rank = b.rank();
        const cuda::DeviceOps local = b.local_ops();
        std::vector<cuda::DeviceOps::Buffer> src, dst;
        std::vector<TensorBuffers> mine;
        for (const Redistribution& r : batch) {
          const auto sb = static_cast<std::size_t>(r.src.local_bytes(rank));
          const auto db = static_cast<std::size_t>(r.dst.local_bytes(rank));
          src.push_back(local.allocate(sb, true));
          dst.push_back(local.allocate(db, true));
          mine.push_back({src.back().data(), sb, dst.back().data(), db});
        }
        auto once = [&] {
          if (batched) {
            execute(*plan, b, std::span<const TensorBuffers>(mine));
          } else {
            for (std::size_t t = 0; t < tensors; ++t)
              execute(singles[t], b, mine[t].src, mine[t].src_bytes, mine[t].dst,
                      mine[t].dst_bytes);
          }
          cuda::check(cudaStreamSynchronize(local.stream()), "cudaStreamSynchronize");
        };
        once();
        for (int i = 0; i < iterations; ++i) {
          const auto start = std::chrono::steady_clock::now();
          once();
          const auto stop = std::chrono::steady_clock::now();
          if (rank == mesh.rank_at(0))
            times.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
        }
      });
      std::sort(times.begin(), times.end());
      return times[times.size() / 2];
    };
    const double one_ms = world_ms(false), batched_ms = world_ms(true);
    std::printf("| %s | %lld / %lld | %.0f | %.0f | %.2f | %.2f |\n", p.name,
                static_cast<long long>(plan->rounds().size()), static_cast<long long>(calls_alone),
                one_us, batched_us, one_ms, batched_ms);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (!cuda::device_available()) {
    std::printf("no CUDA device: nothing to measure\n");
    return 0;
  }
  if (argc > 1) iterations = std::max(3, std::atoi(argv[1]));
  cudaDeviceProp prop{};
  cuda::check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  int runtime = 0, nccl_version = 0;
  cudaRuntimeGetVersion(&runtime);
  ncclGetVersion(&nccl_version);
  std::printf("device: %s, CUDA runtime %d, NCCL %d\n\n", prop.name, runtime, nccl_version);
  cudaStream_t stream;
  cuda::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  pack_table(stream);
  overhead_table(stream);
  batch_table(stream);
  cudaStreamDestroy(stream);
  return 0;
}
