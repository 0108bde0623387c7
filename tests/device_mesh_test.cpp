#include <catch2/catch.hpp>

#include <dtensor/device_mesh.hpp>

using namespace dtensor;

TEST_CASE("a mesh maps ranks to row-major coordinates and back", "[mesh]") {
  const DeviceMesh m({2, 3, 4});
  CHECK(m.ndim() == 3);
  CHECK(m.size() == 24);
  CHECK(m.size(2) == 4);
  for (int r = 0; r < m.size(); ++r) {
    const MeshCoord c = m.coordinate(r);
    CHECK(c == MeshCoord{r / 12, (r / 4) % 3, r % 4});
    CHECK(m.rank(c) == r);
    CHECK(m.rank_at(r) == r);
    CHECK(m.index_of(r) == r);
  }
  CHECK_FALSE(m.contains(24));
  CHECK_FALSE(m.contains(-1));
}

TEST_CASE("groups along a mesh dim", "[mesh]") {
  const DeviceMesh m({2, 4}, {"dp", "tp"});
  const MeshGroup tp = m.group(6, m.dim("tp"));
  CHECK(tp.size == 4);
  CHECK(tp.index == 2);
  CHECK(tp.rank(0) == 4);
  CHECK(tp.rank(3) == 7);
  const MeshGroup dp = m.group(6, m.dim("dp"));
  CHECK(dp == MeshGroup{2, 4, 2, 1});
  CHECK(dp.rank(0) == 2);
  CHECK(dp.rank(1) == 6);
}

TEST_CASE("every rank of a group agrees on the group", "[mesh]") {
  const DeviceMesh m({2, 2, 2});
  for (int dim = 0; dim < 3; ++dim) {
    for (int r = 0; r < m.size(); ++r) {
      const MeshGroup g = m.group(r, dim);
      CHECK(g.rank(g.index) == r);
      for (int i = 0; i < g.size; ++i) {
        const MeshGroup other = m.group(g.rank(i), dim);
        CHECK(other.first == g.first);
        CHECK(other.stride == g.stride);
        CHECK(other.index == i);
      }
    }
  }
}

TEST_CASE("sub-meshes keep the global ranks of their parent", "[mesh]") {
  const DeviceMesh m({2, 2, 2}, {"pp", "dp", "tp"});
  const DeviceMesh tp = m.submesh({"tp"}, 5);  // rank 5 = (1, 0, 1)
  CHECK(tp.ndim() == 1);
  CHECK(tp.size() == 2);
  CHECK(tp.name(0) == "tp");
  CHECK(tp.rank_at(0) == 4);
  CHECK(tp.rank_at(1) == 5);
  CHECK(tp.coordinate(5) == MeshCoord{1});
  CHECK_FALSE(tp.contains(6));

  const DeviceMesh pp_tp = m.submesh({"tp", "pp"}, 2);  // rank 2 = (0, 1, 0): dp fixed at 1
  CHECK(pp_tp.ndim() == 2);
  CHECK(pp_tp.name(0) == "pp");
  CHECK(pp_tp.rank(MeshCoord{0, 0}) == 2);
  CHECK(pp_tp.rank(MeshCoord{1, 1}) == 7);
  CHECK(pp_tp.coordinate(7) == MeshCoord{1, 1});
  CHECK_FALSE(pp_tp.contains(0));
  const MeshGroup g = pp_tp.group(7, 0);
  CHECK(g.rank(0) == 3);
  CHECK(g.rank(1) == 7);
  // Row-major positions and coordinates without the global ranks in between.
  for (int i = 0; i < pp_tp.size(); ++i) {
    CHECK(pp_tp.coordinate_at(i) == pp_tp.coordinate(pp_tp.rank_at(i)));
    CHECK(pp_tp.index(pp_tp.coordinate_at(i)) == i);
    CHECK(pp_tp.index(pp_tp.coordinate_at(i)) == pp_tp.index_of(pp_tp.rank_at(i)));
  }
  CHECK_THROWS_WITH(pp_tp.coordinate_at(4), Catch::Contains("4"));
  CHECK_THROWS_WITH(pp_tp.index(MeshCoord{0, 2}), Catch::Contains("2"));
  CHECK_THROWS_WITH(pp_tp.index(MeshCoord{0}), Catch::Contains("1"));
}

TEST_CASE("bad meshes are refused with the offending value", "[mesh][errors]") {
  CHECK_THROWS_WITH(DeviceMesh(MeshShape{}), "a device mesh needs at least 1 dim, got 0");
  CHECK_THROWS_WITH(DeviceMesh({2, 0}), "mesh dim 1 has extent 0: extents must be at least 1");
  CHECK_THROWS_WITH(DeviceMesh({-3}), "mesh dim 0 has extent -3: extents must be at least 1");
  CHECK_THROWS_WITH(DeviceMesh({1, 1, 1, 1, 1, 1, 1, 1, 1}),
                    "too many elements: at most 8 fit, got 9");
  CHECK_THROWS_WITH(DeviceMesh({65536, 65536}),
                    "mesh of 2 dims is too large: more than 2^31-1 ranks");
  CHECK_THROWS_WITH(DeviceMesh({2, 4}, {"dp"}), "a mesh of 2 dims needs 2 dim names, got 1");
  CHECK_THROWS_WITH(DeviceMesh({2, 4}, {"dp", "dp"}), "mesh dim name 'dp' is used twice");
  CHECK_THROWS_WITH(DeviceMesh({2}, {"a_name_that_is_too_long"}),
                    "mesh dim name 'a_name_that_is_too_long' must be 1 to 15 characters");
  const DeviceMesh m({2, 4}, {"dp", "tp"});
  CHECK_THROWS_WITH(m.dim("cp"), "the mesh has no dim named 'cp'");
  CHECK_THROWS_WITH(DeviceMesh({2}).dim("dp"),
                    "the mesh's dims have no names, so 'dp' names nothing");
  CHECK_THROWS_WITH(m.coordinate(8), "rank 8 is not in this mesh of 8 ranks");
  CHECK_THROWS_WITH(m.size(2), "mesh dim 2 is out of range for a mesh of 2 dims");
  CHECK_THROWS_WITH(m.rank(MeshCoord{0, 4}),
                    "coordinate 4 on mesh dim 1 is out of range for extent 4");
  CHECK_THROWS_WITH(m.rank(MeshCoord{0}), "a coordinate of 1 entries for a mesh of 2 dims");
  CHECK_THROWS_WITH(m.group(0, -1), "mesh dim -1 is out of range for a mesh of 2 dims");
}
