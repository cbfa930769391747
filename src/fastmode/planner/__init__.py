"""fastmode's planner: a hardware cost model and the tools built on it.

Module map (each one concept; none imports torch):

- weight_format   bytes per parameter by weight class, per storage format
- model_spec      ModelSpec: a decoder's shape, parameter counts, KV bytes
- hardware        Hardware: one device's figures; Calibration overrides
- catalog         load the JSON catalogs in fastmode/data/catalog/
- moe             expected distinct experts a batch touches
- cost_model      CostModel: step time of decode, prefill and mixed steps
- speculative     SpecConfig and the cost of a draft+verify cycle
- sram_fit        fit SRAM machines' per-layer latency floor to published speeds
- operating_point steady-state per-user / aggregate tok/s and $/Mtok at a batch
- queueing        Erlang C waits for batch slots
- fleet           cheapest replicas / batch caps / speculation per tier
- plots           bus curve and speed/price frontier PNGs
- command         `fastmode plan`
- chain           p^n reliability: expected time and cost to a correct result
- chain_command   `fastmode chain`
"""

from fastmode.planner.cost_model import CostModel, StepCost
from fastmode.planner.hardware import Calibration, Hardware
from fastmode.planner.model_spec import ModelSpec
from fastmode.planner.speculative import SpecConfig
from fastmode.planner.weight_format import WeightFormat

__all__ = ["Calibration", "CostModel", "Hardware", "ModelSpec", "SpecConfig", "StepCost", "WeightFormat"]
