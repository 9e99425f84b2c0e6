// rvctl's tune commands (issue 17's tuning jobs):
//   rvctl tune start --shape-class C [--dtype bf16|f16|f32]
//         [--shapes NxRxC,...] [--generator NAME] [--max-iter N]
//         [--patience N] [--min-improvement F] [--seed N]
//         [--start naive|product] [--device N] [--json]
//   rvctl tune status ID [--iterations] [--json]   (--iterations: the
//         improvement log, one line per iteration, and the best source)
//   rvctl tune list [--json]
//   rvctl tune watch ID [--json]   (each change, until the job ends)
//   rvctl tune cancel ID
// Exit status as rvctl's: 0, 1 when rvd reports an error (or a watched job
// failed), 2 on usage errors.
#ifndef RVD_CLIENT_RVCTL_TUNE_H_
#define RVD_CLIENT_RVCTL_TUNE_H_

#include <memory>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"

namespace rvd {

// args: what follows "tune" on the command line (the subcommand first).
int RunTuneCommand(const std::shared_ptr<grpc::Channel>& channel,
                   const std::vector<std::string>& args);

}  // namespace rvd

#endif  // RVD_CLIENT_RVCTL_TUNE_H_
