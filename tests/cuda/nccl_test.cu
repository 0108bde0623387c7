// The NCCL backend with a world of one rank (the only world one GPU allows): every collective
// call and the grouped point-to-point round, plans through execute(), errors named.
#include <catch2/catch.hpp>

#include <dtensor/backend/nccl.cuh>
#include <dtensor/batch_plan.hpp>
#include <dtensor/execute.hpp>
#include <dtensor/execute_batch.hpp>
#include <dtensor/parse.hpp>
#include <dtensor/planner.hpp>
#include <dtensor/verify.hpp>

#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

using namespace dtensor;

// NCCL's local ops fill in place (cuda::DeviceOps::fill_around_in_place).
static_assert(detail::abilities_of<detail::Link<NcclBackend>>.fills_in_place);

namespace {

struct Stream {
  cudaStream_t s = nullptr;
  Stream() {
    cuda::check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~Stream() { cudaStreamDestroy(s); }
};

template <class T>
struct Device {
  T* p = nullptr;
  std::size_t n;
  explicit Device(std::size_t count) : n(count) {
    cuda::check(cudaMalloc(&p, count * sizeof(T) + 1), "cudaMalloc");
  }
  ~Device() { cudaFree(p); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  void set(const std::vector<T>& v) {
    cuda::check(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
                "cudaMemcpy");
  }
  std::vector<T> get() const {
    std::vector<T> v(n);
    cuda::check(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return v;
  }
};

std::vector<float> iota(std::size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

}  // namespace

TEST_CASE("every collective on a world of one rank", "[nccl]") {
  NcclComm world(nccl_unique_id(), 1, 0);
  Stream stream;
  const DeviceMesh mesh({1, 1});
  NcclBackend b(world.get(), mesh, stream.s);
  CHECK(b.rank() == 0);
  const std::size_t n = 1 << 16;
  Device<float> send(n), recv(n);
  const auto values = iota(n, 1.0f);
  send.set(values);
  for (int k = 0; k < 2; ++k) {
    b.all_gather(k, send.p, recv.p, n * sizeof(float));
    b.synchronize();
    CHECK(recv.get() == values);
    for (ReduceOp op :
         {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min, ReduceOp::product}) {
      cuda::check(cudaMemset(recv.p, 0, n * sizeof(float)), "cudaMemset");
      b.reduce_scatter(k, send.p, recv.p, n, DType::f32, op);
      b.synchronize();
      CHECK(recv.get() == values);
      cuda::check(cudaMemset(recv.p, 0, n * sizeof(float)), "cudaMemset");
      b.all_reduce(k, send.p, recv.p, n, DType::f32, op);
      b.synchronize();
      CHECK(recv.get() == values);
    }
    cuda::check(cudaMemset(recv.p, 0, n * sizeof(float)), "cudaMemset");
    b.all_to_all(k, send.p, recv.p, n * sizeof(float));
    b.synchronize();
    CHECK(recv.get() == values);
  }
  // A collective of no element launches nothing: its buffers (null here) are never read.
  for (int k = 0; k < 2; ++k) {
    b.all_gather(k, nullptr, nullptr, 0);
    b.reduce_scatter(k, nullptr, nullptr, 0, DType::f32, ReduceOp::sum);
    b.all_reduce(k, nullptr, nullptr, 0, DType::bf16, ReduceOp::avg);
    b.all_to_all(k, nullptr, nullptr, 0);
  }
  b.synchronize();
  // A grouped round with messages to self, matched in order.
  cuda::check(cudaMemset(recv.p, 0, n * sizeof(float)), "cudaMemset");
  const SendMessage sends[] = {{0, send.p, 1000 * sizeof(float)},
                               {0, send.p + 1000, (n - 1000) * sizeof(float)}};
  const RecvMessage recvs[] = {{0, recv.p, 1000 * sizeof(float)},
                               {0, recv.p + 1000, (n - 1000) * sizeof(float)}};
  b.exchange(sends, recvs);
  b.synchronize();
  CHECK(recv.get() == values);
}

TEST_CASE("every dtype through NCCL's reductions", "[nccl]") {
  NcclComm world(nccl_unique_id(), 1, 0);
  Stream stream;
  NcclBackend b(world.get(), DeviceMesh({1}), stream.s);
  for (DType dtype : all_dtypes) {
    const std::size_t n = 4096, bytes = n * size_of(dtype);
    Device<std::byte> send(bytes), recv(bytes);
    std::vector<std::byte> v(bytes);
    for (std::size_t i = 0; i < bytes; ++i) v[i] = static_cast<std::byte>((i * 37) & 0x3f);
    send.set(v);
    b.all_reduce(0, send.p, recv.p, n, dtype, ReduceOp::sum);
    b.synchronize();
    CHECK(recv.get() == v);
  }
}

TEST_CASE("plans run through execute() on NCCL", "[nccl]") {
  NcclComm world(nccl_unique_id(), 1, 0);
  Stream stream;
  const DeviceMesh mesh({1, 1});
  NcclBackend b(world.get(), mesh, stream.s);
  const Shape shape{64, 96};
  const Placement options[] = {Replicate(), Shard(0), Shard(1), Partial()};
  int runs = 0;
  for (const Placement& p : options)
    for (const Placement& q : options)
      for (const Placement& r : options) {
        const Layout src(mesh, {p, q}, shape, DType::f32),
            dst(mesh, {r, Replicate()}, shape, DType::f32);
        const Plan plan = plan_redistribute(src, dst);
        const std::vector<float> in = global_view_block<float>(src, 0);
        Device<float> dsrc(in.size()), ddst(static_cast<std::size_t>(dst.local_numel(0)));
        dsrc.set(in);
        execute(plan, b, dsrc.p, in.size() * sizeof(float), ddst.p, ddst.n * sizeof(float));
        b.synchronize();
        CHECK(ddst.get() == global_view_block<float>(dst, 0));
        ++runs;
      }
  CHECK(runs == 64);
}

TEST_CASE("a batch runs through execute() on NCCL", "[nccl][batch]") {
  NcclComm world(nccl_unique_id(), 1, 0);
  Stream stream;
  const DeviceMesh mesh({1, 1});
  NcclBackend b(world.get(), mesh, stream.s);
  const char* pairs[][2] = {
      {"S(0),R", "R,S(1)"}, {"P,R", "R,R"}, {"S(1),S(0)", "S(0),S(1)"}, {"R,P", "S(0),R"}};
  std::vector<Redistribution> tensors;
  for (int t = 0; t < 8; ++t) {
    const Shape shape{8 + t, 24 - t};
    tensors.push_back({Layout(mesh, parse_placements(pairs[t % 4][0]), shape, DType::f32),
                       Layout(mesh, parse_placements(pairs[t % 4][1]), shape, DType::f32)});
  }
  const BatchPlan<8> batch = plan_batch<8>(tensors);
  std::vector<std::unique_ptr<Device<float>>> in, out;
  std::vector<TensorBuffers> buffers;
  for (const Redistribution& r : tensors) {
    const std::vector<float> x = global_view_block<float>(r.src, 0);
    in.push_back(std::make_unique<Device<float>>(x.size()));
    in.back()->set(x);
    out.push_back(std::make_unique<Device<float>>(static_cast<std::size_t>(r.dst.local_numel(0))));
    buffers.push_back(
        {in.back()->p, x.size() * sizeof(float), out.back()->p, out.back()->n * sizeof(float)});
  }
  execute(batch, b, std::span<const TensorBuffers>(buffers));
  b.synchronize();
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    CHECK(out[t]->get() == global_view_block<float>(tensors[t].dst, 0));
    CHECK(in[t]->get() == global_view_block<float>(tensors[t].src, 0));
  }
  // Started by execute_async: enqueued on the stream, a fence to wait for.
  for (auto& o : out) o->set(std::vector<float>(o->n, 0.0f));
  Execution<NcclBackend> e = execute_async(batch, b, std::span<const TensorBuffers>(buffers));
  e.wait();
  for (std::size_t t = 0; t < tensors.size(); ++t)
    CHECK(out[t]->get() == global_view_block<float>(tensors[t].dst, 0));
}

TEST_CASE("NCCL and CUDA errors become named exceptions", "[nccl][errors]") {
  NcclComm world(nccl_unique_id(), 1, 0);
  Stream stream;
  CHECK_THROWS_WITH(NcclBackend(world.get(), DeviceMesh({2}), stream.s),
                    Catch::Contains("the world communicator has 1 ranks, the mesh 2"));
  NcclBackend b(world.get(), DeviceMesh({1}), stream.s);
  // NCCL's own argument checks, its message passed on.
  CHECK_THROWS_WITH(
      cuda::check_nccl(ncclAllGather(nullptr, nullptr, 16, ncclUint8, nullptr, stream.s),
                       "ncclAllGather"),
      Catch::Contains("ncclAllGather failed: invalid argument"));
  // A bad peer inside a grouped round: the group is closed, the communicators aborted.
  Device<float> y(16);
  const SendMessage astray[] = {{3, y.p, 64}};
  CHECK_THROWS_WITH(b.exchange(astray, {}), Catch::Contains("rank 3"));
  Device<float> x(16);
  const RecvMessage lonely[] = {{0, x.p, 64}};
  CHECK_THROWS_WITH(b.exchange({}, lonely), Catch::Contains("without a matching send"));
  CHECK_THROWS_WITH(cuda::check(cudaErrorInvalidValue, "cudaMemcpyAsync"),
                    Catch::Contains("cudaMemcpyAsync failed: invalid argument"));
}

TEST_CASE("execute_async on NCCL: enqueued at once, a fence to wait for", "[nccl][async]") {
  NcclComm world(nccl_unique_id(), 1, 0);
  Stream stream;
  const DeviceMesh mesh({1, 1});
  NcclBackend b(world.get(), mesh, stream.s);
  const Layout src(mesh, parse_placements("S(0),R"), {64, 1024}, DType::f32);
  const Layout dst(mesh, parse_placements("R,S(1)"), {64, 1024}, DType::f32);
  const Plan plan = plan_redistribute(src, dst);
  const std::size_t n = 64 * 1024;
  Device<float> in(n), out_sync(n), out_async(n);
  in.set(iota(n, 3.0f));
  execute(plan, b, in.p, n * sizeof(float), out_sync.p, n * sizeof(float));
  b.synchronize();
  std::vector<Execution<NcclBackend>> running;
  for (int i = 0; i < 8; ++i)
    running.push_back(
        execute_async(plan, b, in.p, n * sizeof(float), out_async.p, n * sizeof(float)));
  for (auto it = running.rbegin(); it != running.rend(); ++it) it->wait();
  CHECK(running.front().test());
  CHECK(out_async.get() == out_sync.get());
}
