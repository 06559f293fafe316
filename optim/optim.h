// Everything of optim/ in one include: the optimizers, gradient clipping, loss scaling and LR schedules.
#pragma once
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"
