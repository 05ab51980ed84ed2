// The C++ example of docs/API.md, built and run by the test suite (multiproc: example-cpp).
#include <braid/braid.hpp>
#include <iostream>
#include <vector>

int main() {
  auto comm = braid::Communicator::fromEnv();  // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...
  if (!comm.ok()) { std::cerr << comm.status().toString() << "\n"; return 1; }
  std::vector<float> grad(1 << 20, 1.0f);
  braid::Work w = comm->allReduce(grad.data(), grad.data(), grad.size(),
                                  braid::DataType::kFloat32, braid::ReduceOp::kAvg);
  // ... other work here: the collective runs on the communicator's worker thread ...
  braid::Status s = w.wait();
  if (!s.ok()) { std::cerr << s.toString() << "\n"; return 1; }
  std::cout << "rank " << comm->rank() << " of " << comm->size() << ": " << grad[0] << "\n";
}  // the last copy of the Communicator destroys it
