#pragma once

#include <string_view>

// The reasons the library rejects input. Each is a tag whose name appears in the compiler's
// message when the check fails in constant evaluation, and whose text (with "{}" filled by the
// offending values) is the run-time dtensor::error message.
namespace dtensor::detail::why {

// A macro, since each reason is a type named by its argument (a template cannot declare one).
// NOLINTNEXTLINE(cppcoreguidelines-macro-usage): see above
#define DTENSOR_WHY(name, message)                    \
  struct name {                                       \
    static constexpr std::string_view text = message; \
  }

DTENSOR_WHY(capacity_exceeded, "too many elements: at most {} fit, got {}");
DTENSOR_WHY(index_out_of_range, "index {} is out of range for a size of {}");
DTENSOR_WHY(shard_dim_out_of_range, "Shard({}) is out of range for a tensor of {} dims");
DTENSOR_WHY(shard_dim_unrepresentable, "Shard({}) is out of range: tensors have at most {} dims");
DTENSOR_WHY(not_a_shard, "placement {} is not a Shard and has no tensor dim");
DTENSOR_WHY(mesh_no_dims, "a device mesh needs at least 1 dim, got 0");
DTENSOR_WHY(mesh_too_many_dims, "a device mesh has at most {} dims, got {}");
DTENSOR_WHY(mesh_bad_extent, "mesh dim {} has extent {}: extents must be at least 1");
DTENSOR_WHY(mesh_too_large, "mesh of {} dims is too large: more than 2^31-1 ranks");
DTENSOR_WHY(mesh_dim_out_of_range, "mesh dim {} is out of range for a mesh of {} dims");
DTENSOR_WHY(mesh_name_count, "a mesh of {} dims needs {} dim names, got {}");
DTENSOR_WHY(mesh_name_bad, "mesh dim name '{}' must be 1 to {} characters");
DTENSOR_WHY(mesh_name_repeated, "mesh dim name '{}' is used twice");
DTENSOR_WHY(mesh_name_unknown, "the mesh has no dim named '{}'");
DTENSOR_WHY(mesh_unnamed, "the mesh's dims have no names, so '{}' names nothing");
DTENSOR_WHY(rank_out_of_mesh, "rank {} is not in this mesh of {} ranks");
DTENSOR_WHY(coord_size_mismatch, "a coordinate of {} entries for a mesh of {} dims");
DTENSOR_WHY(coord_out_of_range, "coordinate {} on mesh dim {} is out of range for extent {}");
DTENSOR_WHY(placement_count_mismatch, "{} placements for a mesh of {} dims: one per mesh dim");
DTENSOR_WHY(tensor_too_many_dims, "a tensor has at most {} dims, got {}");
DTENSOR_WHY(negative_extent, "tensor dim {} has negative size {}");
DTENSOR_WHY(size_overflow, "the tensor's size in bytes overflows 64 bits");
DTENSOR_WHY(bytes_overflow,
            "the bytes a rank moves in this redistribution overflow 64 bits: the tensor is too "
            "large for byte counts");
DTENSOR_WHY(bad_dtype, "unknown dtype {}");
DTENSOR_WHY(bad_reduce_op, "unknown reduce op {}");
DTENSOR_WHY(parse_placement, "cannot read '{}' as a placement: expected S(d), R or P(op)");
DTENSOR_WHY(parse_reduce_op, "unknown reduce op '{}': expected sum, avg, max, min or product");
DTENSOR_WHY(parse_dtype, "unknown dtype '{}': expected f32, f64, f16, bf16, i32, i64 or u8");
DTENSOR_WHY(parse_extents, "cannot read '{}' as {}: expected sizes joined by 'x', e.g. 2x4");
DTENSOR_WHY(parse_number, "'{}' is not a number in '{}'");
DTENSOR_WHY(parse_number_too_long, "'{}' in '{}' is too large: at most 18 digits");
DTENSOR_WHY(parse_empty, "empty {}");
DTENSOR_WHY(layout_mesh_mismatch,
            "the two layouts live on different meshes: {} and {} (or other names or ranks)");
DTENSOR_WHY(layout_shape_mismatch, "the two layouts describe different tensors: shapes {} and {}");
DTENSOR_WHY(layout_dtype_mismatch, "the two layouts have different dtypes: {} and {}");

DTENSOR_WHY(avg_needs_float,
            "Partial(avg) needs a floating-point dtype, not {}: an integer average truncates and "
            "the sum behind it overflows; use Partial(sum)");
DTENSOR_WHY(layout_policy_mismatch, "the two layouts chunk uneven dims with different policies");
DTENSOR_WHY(adjoint_nonlinear, "the adjoint needs R, S(d) or P(sum) placements: P({}) has no dual");

DTENSOR_WHY(relabel_rank_count_mismatch,
            "relabelling needs meshes with the same number of ranks: {} has {} and {} has {}");
DTENSOR_WHY(relabel_partial,
            "relabelling moves whole blocks and a Partial block is not the value: the {} layout "
            "has P({}) on mesh dim {}");
DTENSOR_WHY(relabel_too_many_ranks, "relabelling handles at most {} ranks, got {}");
DTENSOR_WHY(relabel_exact_too_large,
            "the exact relabelling handles at most {} ranks, got {}: use RelabelMethod::greedy");

DTENSOR_WHY(batch_too_many, "a batch holds at most {} tensors, got {}: use a larger BatchPlan<N>");
DTENSOR_WHY(batch_mesh_mismatch,
            "every tensor of a batch lives on one mesh: tensor {} is on {}, tensor 0 on {}");
DTENSOR_WHY(batch_buffer_count, "the batch has {} tensors but {} buffers were given");
DTENSOR_WHY(batch_internal, "internal error: tensor {} reached a collective out of its round {}");

DTENSOR_WHY(no_valid_plan, "internal error: the planner found no valid plan");

DTENSOR_WHY(backend_mesh_mismatch, "the backend's mesh {} is not the plan's mesh {}");
DTENSOR_WHY(world_mesh_mismatch, "the simulated world's mesh {} is not the plan's mesh {}");
DTENSOR_WHY(buffer_too_small, "the {} buffer holds {} bytes, but rank {} needs {}");
DTENSOR_WHY(buffers_overlap,
            "the source and target buffers overlap on rank {} ({} bytes in common): the source "
            "is never written, so the target must be a buffer of its own (in place, only a plan "
            "of all-reduces and scales runs in one buffer, and an all-gather of slabs from this "
            "rank's slab of its target)");
DTENSOR_WHY(batch_buffers_overlap,
            "the target buffer of tensor {} overlaps the {} buffer of tensor {} on rank {} ({} "
            "bytes in common): each target must be a buffer of its own");
DTENSOR_WHY(backend_cannot_reduce,
            "the backend cannot reduce {} values with {}, which step {} of the plan needs");
DTENSOR_WHY(span_dtype_mismatch, "a span of {} for a plan of {}");

#undef DTENSOR_WHY

}  // namespace dtensor::detail::why
