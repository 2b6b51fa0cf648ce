// Experiment sas-poly: is TurboAttention's cubic (Eq. 15) the least-squares fit of e^-x on [0, 1]? Its own
// program (sas_poly.cc, built by experiment.cmake); this registers it with `qattn reproduce`. See README.md.
#include "experiment.h"

namespace qattn::experiments {

void register_experiment_sas_poly(ExperimentList& list) {
  list.add({"sas-poly", "SAS's cubic is a least-squares fit of e^-x on [0, 1]", "TurboAttention Eq. 15",
            "qattn reproduce sas-poly", {}, "qattn_exp_sas_poly"});
}

}  // namespace qattn::experiments
