// Everything of models/nn in one include: Module, the layers and the initialisers.
#pragma once
#include "models/nn/init.h"
#include "models/nn/layers.h"
#include "models/nn/module.h"
