#include <catch2/catch.hpp>

#include <dtensor/parse.hpp>

using namespace dtensor;

TEST_CASE("placements parse in short and long spellings", "[parse]") {
  CHECK(parse_placement("S(0)") == Placement(Shard(0)));
  CHECK(parse_placement(" Shard(-1) ") == Placement(Shard(-1)));
  CHECK(parse_placement("Shard(dim=2)") == Placement(Shard(2)));
  CHECK(parse_placement("R") == Placement(Replicate()));
  CHECK(parse_placement("Replicate()") == Placement(Replicate()));
  CHECK(parse_placement("P") == Placement(Partial()));
  CHECK(parse_placement("P()") == Placement(Partial()));
  CHECK(parse_placement("P(max)") == Placement(Partial(ReduceOp::max)));
  CHECK(parse_placement("Partial(AVG)") == Placement(Partial(ReduceOp::avg)));
  CHECK(parse_placement("Partial(reduce_product)") == Placement(Partial(ReduceOp::product)));
}

TEST_CASE("placement lists", "[parse]") {
  CHECK(parse_placements("S(0),R") == Placements{Shard(0), Replicate()});
  CHECK(parse_placements("[Shard(0), Partial(min), R]") ==
        Placements{Shard(0), Partial(ReduceOp::min), Replicate()});
  CHECK(parse_placements("P(sum)") == Placements{Partial()});
}

TEST_CASE("meshes, shapes and dtypes", "[parse]") {
  CHECK(parse_mesh("2x4") == DeviceMesh({2, 4}));
  CHECK(parse_mesh("8") == DeviceMesh({8}));
  CHECK(parse_mesh("2x2x2").size() == 8);
  CHECK(parse_shape("1024x4096") == Shape{1024, 4096});
  CHECK(parse_shape("0x3") == Shape{0, 3});
  CHECK(parse_shape("7") == Shape{7});
  CHECK(parse_dtype("bf16") == DType::bf16);
  CHECK(parse_dtype("float32") == DType::f32);
  CHECK(parse_dtype("I64") == DType::i64);
  for (DType t : all_dtypes) CHECK(parse_dtype(name(t)) == t);
  for (ReduceOp op : all_reduce_ops) CHECK(parse_reduce_op(name(op)) == op);
}

TEST_CASE("parsing works in constant evaluation", "[parse]") {
  static_assert(parse_placement("S(1)").dim() == 1);
  static_assert(parse_placements("S(0),R,P(max)").size() == 3);
  static_assert(parse_mesh("2x4").size() == 8);
  static_assert(parse_shape("3x5")[1] == 5);
  static_assert(parse_dtype("u8") == DType::u8);
  SUCCEED();
}

TEST_CASE("malformed spellings name the offending text", "[parse][errors]") {
  CHECK_THROWS_WITH(parse_placement("X"),
                    "cannot read 'X' as a placement: expected S(d), R or P(op)");
  CHECK_THROWS_WITH(parse_placement("S"),
                    "cannot read 'S' as a placement: expected S(d), R or P(op)");
  CHECK_THROWS_WITH(parse_placement("S(a)"),
                    "cannot read 'S(a)' as a placement: expected S(d), R or P(op)");
  CHECK_THROWS_WITH(parse_placement("S(0"),
                    "cannot read 'S(0' as a placement: expected S(d), R or P(op)");
  CHECK_THROWS_WITH(parse_placement("R(1)"),
                    "cannot read 'R(1)' as a placement: expected S(d), R or P(op)");
  CHECK_THROWS_WITH(parse_placement("S(99)"),
                    "Shard(99) is out of range: tensors have at most 8 dims");
  CHECK_THROWS_WITH(parse_placement("P(mul)"),
                    "unknown reduce op 'mul': expected sum, avg, max, min or product");
  CHECK_THROWS_WITH(parse_placement(""), "empty placement");
  CHECK_THROWS_WITH(parse_placements(""), "empty placement list");
  CHECK_THROWS_WITH(parse_placements("S(0),,R"), "empty placement");
  CHECK_THROWS_WITH(parse_placements("R,R,R,R,R,R,R,R,R"),
                    "a device mesh has at most 8 dims, got 9");
  CHECK_THROWS_WITH(parse_dtype("f8"),
                    "unknown dtype 'f8': expected f32, f64, f16, bf16, i32, i64 or u8");
  CHECK_THROWS_WITH(parse_mesh("2x0"),
                    "cannot read '2x0' as a mesh: expected sizes joined by 'x', e.g. 2x4");
  CHECK_THROWS_WITH(parse_mesh("2xa"), "'a' is not a number in '2xa'");
  CHECK_THROWS_WITH(parse_mesh(""),
                    "cannot read '' as a mesh: expected sizes joined by 'x', e.g. 2x4");
  CHECK_THROWS_WITH(parse_mesh("2x"), "'' is not a number in '2x'");
  CHECK_THROWS_WITH(parse_mesh("1x1x1x1x1x1x1x1x1"), "a device mesh has at most 8 dims, got 9");
  CHECK_THROWS_WITH(parse_mesh("99999999999"),
                    "cannot read '99999999999' as a mesh: expected sizes joined by 'x', e.g. 2x4");
  CHECK_THROWS_WITH(parse_shape("4x-1"),
                    "cannot read '4x-1' as a shape: expected sizes joined by 'x', e.g. 2x4");
  CHECK_THROWS_WITH(parse_shape("1x1x1x1x1x1x1x1x1"), "a tensor has at most 8 dims, got 9");
  CHECK_THROWS_WITH(parse_shape("123456789012345678901"),
                    "'123456789012345678901' in '123456789012345678901' is too large: at most 18 "
                    "digits");
  CHECK_THROWS_WITH(parse_shape("4x4611686018427387904"),
                    "'4611686018427387904' in '4x4611686018427387904' is too large: at most 18 "
                    "digits");
}
