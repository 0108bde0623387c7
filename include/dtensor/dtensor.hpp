#pragma once

// Everything that needs no backend: core values, parsing, the typed front end, the planner,
// rank relabelling and formatting.
#include "batch_plan.hpp"
#include "config.hpp"
#include "cost_model.hpp"
#include "device_mesh.hpp"
#include "dtype.hpp"
#include "errors.hpp"
#include "explain.hpp"
#include "format.hpp"
#include "layout.hpp"
#include "parse.hpp"
#include "placement.hpp"
#include "plan.hpp"
#include "plan_cache.hpp"
#include "planner.hpp"
#include "reduce_op.hpp"
#include "relabel.hpp"
#include "typed.hpp"
#include "version.hpp"
#include "visualize.hpp"
