// braid-launcher-test: runs the launcher on its own so the launcher's tests do not depend on the
// full `braid` command. `braid-launcher-test -n 2 -- prog` behaves as `braid run -n 2 -- prog`; a
// leading "run" is accepted too, so either spelling of a command line can be pasted.
#include <string>
#include <string_view>
#include <vector>

#include "tools/launcher.h"

int main(int argc, char** argv) {
  std::string runWord = "run";
  std::vector<char*> args{runWord.data()};
  int first = 1;
  if (argc > 1 && std::string_view(argv[1]) == "run") first = 2;
  for (int i = first; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  return braid::tools::runLauncher(static_cast<int>(args.size()) - 1, args.data());
}
