#include "catch.h"
#include "model_fixtures.h"
#include "planner/simulations/placement_simulation.h"

using namespace hybridplan;

namespace {

// Diamond a -> {b, c} -> d; every edge 100 bytes at the profiled batch (1).
//   forward_s  a=1 b=2 c=3 d=1      backward_s a=2 b=4 c=6 d=2
Graph diamond() {
  return test::make_graph({{"a", 1, 2}, {"b", 2, 4}, {"c", 3, 6}, {"d", 1, 2}},
                          {{0, 1, 100}, {0, 2, 100}, {1, 3, 100}, {2, 3, 100}});
}

// Node times at `batch` with linear scaling (the fixtures' cluster gives no call floor).
NodeTimes times_at(const Graph& g, double batch) {
  return ComputeModel(g, test::make_cluster(1, 2)).at_batch(batch);
}

}  // namespace

TEST_CASE("priority order is highest level first", "[placement_simulation]") {
  const PlacementOrder order = placement_priority_order(diamond(), times_at(diamond(), 1));
  // forward levels: d=1, b=2+1=3, c=3+1=4, a=1+max(3,4)=5 -> a, c, b, d
  REQUIRE(order.forward == std::vector<NodeIndex>{0, 2, 1, 3});
  // backward levels (reversed edges): a=2, b=4+2=6, c=6+2=8, d=2+8=10 -> d, c, b, a
  REQUIRE(order.backward == std::vector<NodeIndex>{3, 2, 1, 0});
}

TEST_CASE("placement simulation: hand-computed diamond on two devices", "[placement_simulation]") {
  const Graph g = diamond();
  const PlacementOrder order = placement_priority_order(g, times_at(g, 1));
  // Two devices, 100 bytes/s and 0.5 s latency: one 100-byte edge costs 0.5 + 100/100 = 1.5 s.
  const Cluster c = test::make_cluster(1, 2, 100, 0.5);
  LocalLinks links;
  fill_local_links(c, {0, 1}, links);
  REQUIRE(links.transfer_s(0, 1, 100) == 1.5);
  REQUIRE(links.transfer_s(1, 1, 100) == 0);
  REQUIRE(links.transfer_s(0, 1, 0) == 0);

  PlacementScratch scratch;
  // a, b, d on device 0; c on device 1.
  const PlacementTimes t = simulate_placement(g, order, {0, 0, 1, 0}, links, times_at(g, 1), 1.0, scratch);
  // forward, order a c b d:
  //   a dev0 0-1;  c dev1 ready 1+1.5=2.5 -> 2.5-5.5;  b dev0 1-3;
  //   d dev0 ready max(3, 5.5+1.5=7) -> 7-8                          makespan 8
  REQUIRE(scratch.forward_finish_s == std::vector<double>{1, 3, 5.5, 8});
  REQUIRE(t.forward_s == 8);
  // backward, order d c b a:
  //   d dev0 0-2;  c dev1 ready 2+1.5=3.5 -> 3.5-9.5;  b dev0 2-6;
  //   a dev0 ready max(6, 9.5+1.5=11) -> 11-13                       makespan 13
  REQUIRE(scratch.backward_finish_s == std::vector<double>{13, 6, 9.5, 2});
  REQUIRE(t.backward_s == 13);
  // four cross-device transfers of 1.5 s (a->c, c->d forward; d->c, c->a backward)
  REQUIRE(t.transfer_s == 6);

  // All on one device: the sums, 1+2+3+1 = 7 and 2+4+6+2 = 14, no transfers.
  const PlacementTimes one = simulate_placement(g, order, {0, 0, 0, 0}, links, times_at(g, 1), 1.0, scratch);
  REQUIRE(one.forward_s == 7);
  REQUIRE(one.backward_s == 14);
  REQUIRE(one.transfer_s == 0);

  // b and c on separate devices, a and d with b: the branches overlap.
  //   forward: a 0-1; c dev1 2.5-5.5; b dev0 1-3; d ready 7 -> 8 (same as above: c is longer)
  // At batch factor 2 every time and every byte doubles: transfer 0.5 + 200/100 = 2.5 s.
  //   forward: a 0-2; c dev1 4.5-10.5; b 2-6; d ready max(6, 13) -> 13-15
  const PlacementTimes doubled = simulate_placement(g, order, {0, 0, 1, 0}, links, times_at(g, 2), 2.0, scratch);
  REQUIRE(doubled.forward_s == 15);
  //   backward: d 0-4; c ready 6.5 -> 6.5-18.5; b 4-12; a ready max(12, 21) -> 21-25
  REQUIRE(doubled.backward_s == 25);
  REQUIRE(doubled.transfer_s == 10);
}

TEST_CASE("a device runs its nodes one at a time in priority order", "[placement_simulation]") {
  // Three independent nodes of 1 s on one device finish at 1, 2, 3 (static order).
  const Graph g = test::make_graph({{"x", 1, 1}, {"y", 1, 1}, {"z", 1, 1}}, {});
  const Cluster c = test::make_cluster(1, 2);
  LocalLinks links;
  fill_local_links(c, {0, 1}, links);
  PlacementScratch scratch;
  const PlacementTimes t = simulate_placement(g, placement_priority_order(g, times_at(g, 1)), {0, 0, 1}, links, times_at(g, 1), 1.0, scratch);
  REQUIRE(scratch.forward_finish_s == std::vector<double>{1, 2, 1});
  REQUIRE(t.forward_s == 2);
  REQUIRE(t.backward_s == 2);
}
