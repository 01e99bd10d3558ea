// --comm-overlap's enumeration, declared with the parallel settings (core/config.h).
#pragma once

#include "core/config.h"

namespace tandem::runtime {

using tandem::CommOverlap;

}  // namespace tandem::runtime
