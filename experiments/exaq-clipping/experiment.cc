// Experiment exaq-clipping: does EXAQ's clipping table C*(sigma) follow from Eq. 14? Its own program
// (exaq_clipping.cc, built by experiment.cmake); this registers it with `qattn reproduce`. See README.md.
#include "experiment.h"

namespace qattn::experiments {

void register_experiment_exaq_clipping(ExperimentList& list) {
  list.add({"exaq-clipping", "the clipping table C*(sigma) follows from Eq. 14", "EXAQ Table 1",
            "qattn reproduce exaq-clipping [--fast]", {}, "qattn_exp_exaq_clipping"});
}

}  // namespace qattn::experiments
