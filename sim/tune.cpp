#include "sim/report.h"
namespace kvroute::sim { int tune(const Args&) { return 0; } int targets(const Args&) { return 0; } }
