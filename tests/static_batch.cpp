// Batched plans fold at compile time.
#include <dtensor/batch_plan.hpp>

namespace {

using namespace dtensor;

constexpr DeviceMesh mesh({2, 4});
constexpr Redistribution pairs[] = {
    {Layout(mesh, {Shard(0), Shard(0)}, {64, 32}, DType::bf16),
     Layout(mesh, {Replicate(), Replicate()}, {64, 32}, DType::bf16)},
    {Layout(mesh, {Shard(0), Shard(0)}, {128}, DType::f32),
     Layout(mesh, {Replicate(), Replicate()}, {128}, DType::f32)},
};
constexpr BatchPlan<2> batch = plan_batch<2>(pairs);
// Two tensors, two all-gathers each: two rounds, one per mesh dim.
static_assert(batch.size() == 2);
static_assert(batch.collectives() == 2 && batch.collectives_unbatched() == 4);
static_assert(batch.rounds()[0].tensors == 2 && batch.rounds()[1].tensors == 2);
static_assert(batch.saving_us() > 0);

}  // namespace
