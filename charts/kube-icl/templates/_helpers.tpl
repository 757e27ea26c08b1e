{{/* Prefix of every object's name: the release name, with "-kube-icl" unless it already says so. */}}
{{- define "kube-icl.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kube-icl.plugin" -}}{{ include "kube-icl.fullname" . }}-device-plugin{{- end -}}
{{- define "kube-icl.extender" -}}{{ include "kube-icl.fullname" . }}-extender{{- end -}}
{{- define "kube-icl.scheduler" -}}{{ include "kube-icl.fullname" . }}-scheduler{{- end -}}

{{/* Labels common to every object. */}}
{{- define "kube-icl.labels" -}}
app.kubernetes.io/part-of: kube-icl
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* image reference: repository@digest, else repository:tag (tag defaults to the appVersion). */}}
{{- define "kube-icl.imageRef" -}}
{{- $image := index . 0 -}}{{- $default := index . 1 -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default $default $image.tag) -}}
{{- end -}}
{{- end -}}
{{- define "kube-icl.image" -}}{{ include "kube-icl.imageRef" (list .Values.image .Chart.AppVersion) }}{{- end -}}

{{/* Checks of values that the schema cannot express; each fails with one line naming the value. */}}
{{- define "kube-icl.validate" -}}
{{- if not (has .Values.extender.mode (list "sidecar" "remote")) -}}
{{- fail (printf "extender.mode: %q is not one of sidecar, remote" .Values.extender.mode) -}}
{{- end -}}
{{- if and .Values.scheduler.enabled (lt (int .Values.scheduler.replicas) 1) -}}
{{- fail (printf "scheduler.replicas: must be >= 1, got %v" .Values.scheduler.replicas) -}}
{{- end -}}
{{- if and (eq .Values.extender.mode "remote") (not .Values.scheduler.enabled) -}}
{{- fail "extender.mode: remote needs scheduler.enabled=true (the chart's kube-scheduler holds the client certificate)" -}}
{{- end -}}
{{- if eq .Values.extender.mode "remote" -}}
{{- if not (and .Values.tls.serverSecretName .Values.tls.clientSecretName) -}}
{{- fail "tls: extender.mode=remote needs tls.serverSecretName and tls.clientSecretName (mutual TLS)" -}}
{{- end -}}
{{- end -}}
{{- $extcfg := default dict .Values.extender.config -}}
{{- if and (hasKey $extcfg "decideCpuPods") (not (kindIs "bool" $extcfg.decideCpuPods)) -}}
{{- fail (printf "extender.config.decideCpuPods: expected true or false, got %v" $extcfg.decideCpuPods) -}}
{{- end -}}
{{- if eq (toString (get $extcfg "decideCpuPods")) "true" -}}
{{- if eq (toString (dig "kube" "podSelection" "all" $extcfg)) "labelled" -}}
{{- fail "extender.config.decideCpuPods: true needs extender.config.kube.podSelection: all (it reads every pod's CPU and memory)" -}}
{{- end -}}
{{- end -}}
{{- if hasKey $extcfg "tiers" -}}
{{- $tiers := $extcfg.tiers -}}
{{- if kindIs "string" $tiers -}}
{{- if not (has $tiers (list "topograph" "gke" "eks")) -}}
{{- fail (printf "extender.config.tiers: %q is no preset (topograph, gke, eks); give a preset or a list of node label keys" $tiers) -}}
{{- end -}}
{{- else if kindIs "slice" $tiers -}}
{{- range $i, $key := $tiers -}}
{{- if not (and (kindIs "string" $key) (regexMatch "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$" $key)) -}}
{{- fail (printf "extender.config.tiers[%d]: %v is not a node label key" $i $key) -}}
{{- end -}}
{{- end -}}
{{- else if $tiers -}}
{{- fail (printf "extender.config.tiers: expected a preset name or a list of node label keys, got %v" $tiers) -}}
{{- end -}}
{{- end -}}
{{- $seen := dict -}}
{{- range $i, $pool := .Values.devicePlugin.pools -}}
{{- if not (kindIs "map" $pool) -}}
{{- fail (printf "devicePlugin.pools[%d]: expected a mapping with a name, got %v" $i $pool) -}}
{{- end -}}
{{- if not $pool.name -}}
{{- fail (printf "devicePlugin.pools[%d].name: required" $i) -}}
{{- end -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?$" $pool.name) -}}
{{- fail (printf "devicePlugin.pools[%d].name: %q must be a DNS label of at most 22 characters" $i $pool.name) -}}
{{- end -}}
{{- if hasKey $seen $pool.name -}}
{{- fail (printf "devicePlugin.pools[%d].name: %q is used by another pool" $i $pool.name) -}}
{{- end -}}
{{- $_ := set $seen $pool.name true -}}
{{- $backend := default $.Values.devicePlugin.backend $pool.backend -}}
{{- if not (has $backend (list "sim" "udev" "nvml")) -}}
{{- fail (printf "devicePlugin.pools[%d].backend: %q is not one of sim, udev, nvml" $i $backend) -}}
{{- end -}}
{{- if and (eq $backend "sim") (not (or $pool.topology $pool.topologyFile)) -}}
{{- fail (printf "devicePlugin.pools[%d].topology: the sim backend needs topology or topologyFile" $i) -}}
{{- end -}}
{{- if and $pool.topology $pool.topologyFile -}}
{{- fail (printf "devicePlugin.pools[%d]: set topology or topologyFile, not both" $i) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The extender's config file: extender.config, then the keys the chart owns. */}}
{{- define "kube-icl.extenderConfig" -}}
{{- $owned := dict "resourceName" .Values.resourceName "schedulerName" .Values.scheduler.schedulerName -}}
{{- $_ := set $owned "probeListen" (dict "host" "0.0.0.0" "port" (int .Values.extender.probePort)) -}}
{{- $election := dict "namespace" .Release.Namespace "leaseName" (include "kube-icl.extender" .) -}}
{{- $_ := set $owned "leaderElection" (mustMergeOverwrite (deepCopy (default dict .Values.extender.config.leaderElection)) $election) -}}
{{- if eq .Values.extender.mode "sidecar" -}}
{{- $_ := set $owned "listen" (dict "host" "127.0.0.1" "port" (int .Values.extender.port)) -}}
{{- else -}}
{{- $_ := set $owned "listen" (dict "host" "0.0.0.0" "port" (int .Values.extender.port)) -}}
{{- $_ := set $owned "tls" (dict "cert" "/etc/kube-icl/tls/tls.crt" "key" "/etc/kube-icl/tls/tls.key" "clientCA" "/etc/kube-icl/tls/ca.crt") -}}
{{- end -}}
{{- $config := mustMergeOverwrite (deepCopy (default dict .Values.extender.config)) $owned -}}
{{- toYaml $config -}}
{{- end -}}

{{/* The extender stanza of the KubeSchedulerConfiguration. */}}
{{- define "kube-icl.schedulerExtender" -}}
{{- $remote := eq .Values.extender.mode "remote" -}}
{{- if $remote }}
- urlPrefix: https://{{ include "kube-icl.extender" . }}.{{ .Release.Namespace }}.svc:{{ .Values.extender.port }}
{{- else }}
- urlPrefix: http://127.0.0.1:{{ .Values.extender.port }}
{{- end }}
  filterVerb: filter
  prioritizeVerb: prioritize
  preemptVerb: preempt
  bindVerb: bind
  weight: {{ .Values.extender.weight }}
  enableHTTPS: {{ $remote }}
  {{- if $remote }}
  tlsConfig:
    certFile: /etc/kube-icl-scheduler/tls/tls.crt
    keyFile: /etc/kube-icl-scheduler/tls/tls.key
    caFile: /etc/kube-icl-scheduler/tls/ca.crt
    serverName: {{ default (printf "%s.%s.svc" (include "kube-icl.extender" .) .Release.Namespace) .Values.tls.serverName }}
  {{- end }}
  nodeCacheCapable: true
  httpTimeout: {{ .Values.extender.httpTimeout }}
  ignorable: {{ .Values.extender.ignorable }}
  {{- if ne (toString (get (default dict .Values.extender.config) "decideCpuPods")) "true" }}
  managedResources:
    - name: {{ .Values.resourceName }}
      ignoredByScheduler: false
    - name: {{ .Values.sharedResourceName | default "kube-icl.io/accelerator-milli" }}
      ignoredByScheduler: false
  {{- end }}
{{- end -}}

{{/* One pool's plugin config file: devicePlugin.config, pool keys, pool.config, then the chart's own keys. */}}
{{- define "kube-icl.poolConfig" -}}
{{- $ := index . 0 -}}{{- $pool := index . 1 -}}
{{- $config := deepCopy (default dict $.Values.devicePlugin.config) -}}
{{- range $key := list "udev" "nvml" -}}
{{- if hasKey $pool $key -}}
{{- $_ := set $config $key (mustMergeOverwrite (deepCopy (default dict (get $config $key))) (get $pool $key)) -}}
{{- end -}}
{{- end -}}
{{- $config = mustMergeOverwrite $config (deepCopy (default dict $pool.config)) -}}
{{- $owned := dict "resourceName" $.Values.resourceName "backend" (default $.Values.devicePlugin.backend $pool.backend) -}}
{{- $_ := set $owned "pods" "kubernetes" -}}
{{- $_ := set $owned "publish" true -}}
{{- $_ := set $owned "metricsAddress" (printf "0.0.0.0:%d" (int $.Values.devicePlugin.metricsPort)) -}}
{{- $audit := default dict $.Values.devicePlugin.audit -}}
{{- $_ := set $owned "audit" (dict "enabled" (or (not (hasKey $audit "enabled")) $audit.enabled) "interval" (default 30 $audit.intervalSeconds) "socket" "/var/lib/kubelet/pod-resources/kubelet.sock") -}}
{{- if $pool.topologyFile -}}
{{- $_ := set $owned "topology" "/etc/kube-icl/topology.yaml" -}}
{{- else if $pool.topology -}}
{{- $_ := set $owned "topology" $pool.topology -}}
{{- end -}}
{{- if $pool.linkDomain -}}
{{- $_ := set $owned "linkDomain" $pool.linkDomain -}}
{{- end -}}
{{- toYaml (mustMergeOverwrite $config $owned) -}}
{{- end -}}

{{- define "kube-icl.poolName" -}}
{{- $ := index . 0 -}}{{- $pool := index . 1 -}}
{{- printf "%s-%s" (include "kube-icl.plugin" $) $pool.name -}}
{{- end -}}
