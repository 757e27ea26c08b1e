"""Limits of the resource.k8s.io/v1 API that shape what the driver publishes.

The values are those of ``k8s.io/api`` v0.37.2 ``resource/v1/types.go`` (the
Kubernetes the e2e tests build); ``tests/test_dra_limits.py`` compares them with
that file whenever the Go module cache holds it.
"""

from __future__ import annotations

__all__ = [
    "ATTRIBUTE_MAX_VALUE_LENGTH",
    "CONSUMPTIONS_PER_DEVICE",
    "COUNTERS_PER_CONSUMPTION",
    "COUNTERS_PER_SET",
    "COUNTER_SETS_PER_SLICE",
    "DEVICES_PER_SLICE",
    "DEVICES_PER_SLICE_ADVANCED",
    "DEVICE_NAME_MAX_LENGTH",
    "DRIVER_NAME_MAX_LENGTH",
    "GO_NAMES",
    "MAX_ATTRIBUTES_AND_CAPACITIES",
    "MAX_TAINTS_PER_DEVICE",
]

#: ResourceSliceMaxDevices: devices in one slice when none consumes counters or has taints.
DEVICES_PER_SLICE = 128
#: ResourceSliceMaxDevicesWithAdvancedFeatures: devices in one slice when any consumes counters or has taints.
DEVICES_PER_SLICE_ADVANCED = 64
#: ResourceSliceMaxCounterSets: counter sets in one slice (sharedCounters).
COUNTER_SETS_PER_SLICE = 8
#: ResourceSliceMaxCountersPerCounterSet: counters in one counter set.
COUNTERS_PER_SET = 32
#: ResourceSliceMaxDeviceCounterConsumptionsPerDevice: counter sets one device may consume from.
CONSUMPTIONS_PER_DEVICE = 2
#: ResourceSliceMaxCountersPerDeviceCounterConsumption: counters one device consumes from one set.
COUNTERS_PER_CONSUMPTION = 32
#: ResourceSliceMaxAttributesAndCapacitiesPerDevice.
MAX_ATTRIBUTES_AND_CAPACITIES = 32
#: DeviceAttributeMaxValueLength: bytes of a string attribute.
ATTRIBUTE_MAX_VALUE_LENGTH = 64
#: DeviceTaintsMaxLength.
MAX_TAINTS_PER_DEVICE = 16
#: DriverNameMaxLength.
DRIVER_NAME_MAX_LENGTH = 63
#: A device name is a DNS label.
DEVICE_NAME_MAX_LENGTH = 63

#: The Go constant behind each value, for the test that reads types.go.
GO_NAMES: dict[str, int] = {
    "ResourceSliceMaxDevices": DEVICES_PER_SLICE,
    "ResourceSliceMaxDevicesWithAdvancedFeatures": DEVICES_PER_SLICE_ADVANCED,
    "ResourceSliceMaxCounterSets": COUNTER_SETS_PER_SLICE,
    "ResourceSliceMaxCountersPerCounterSet": COUNTERS_PER_SET,
    "ResourceSliceMaxDeviceCounterConsumptionsPerDevice": CONSUMPTIONS_PER_DEVICE,
    "ResourceSliceMaxCountersPerDeviceCounterConsumption": COUNTERS_PER_CONSUMPTION,
    "ResourceSliceMaxAttributesAndCapacitiesPerDevice": MAX_ATTRIBUTES_AND_CAPACITIES,
    "DeviceAttributeMaxValueLength": ATTRIBUTE_MAX_VALUE_LENGTH,
    "DeviceTaintsMaxLength": MAX_TAINTS_PER_DEVICE,
    "DriverNameMaxLength": DRIVER_NAME_MAX_LENGTH,
}
