{{/* Names. */}}
{{- define "gpushare.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpushare.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains (include "gpushare.name" .) .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "gpushare.name" .) | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels: common ones, and the selector of one component (the argument's .component). */}}
{{- define "gpushare.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "gpushare.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "gpushare.componentLabels" -}}
{{ include "gpushare.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpushare.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpushare.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The gpushare image. */}}
{{- /* kube-scheduler's image: the tag named, else the cluster's own release (vMAJOR.MINOR.PATCH
       of the API server, without a vendor's suffix such as -eks-... or +k3s1), which the
       version-skew policy always allows and registry.k8s.io always has. */ -}}
{{- define "gpushare.scheduler.image" -}}
{{- $i := .Values.scheduler.image -}}
{{- if $i.tag -}}
{{- printf "%s:%s" $i.repository $i.tag -}}
{{- else -}}
{{- $own := regexFind `^v?[0-9]+\.[0-9]+\.[0-9]+` .Capabilities.KubeVersion.Version -}}
{{- printf "%s:v%s" $i.repository (trimPrefix "v" $own) -}}
{{- end -}}
{{- end -}}

{{- /* kube-scheduler's readiness path: /readyz from 1.31 (kubernetes#118148), /healthz before it
       (1.30 answers 404 to /readyz, so the pod would never be Ready). Read from the release
       the image runs: the tag named, else the cluster's; a tag that names no release gets
       /healthz, which every release serves. */ -}}
{{- define "gpushare.scheduler.readyPath" -}}
{{- $i := .Values.scheduler.image -}}
{{- $release := regexFind `^v?[0-9]+\.[0-9]+\.[0-9]+` (ternary (toString $i.tag) .Capabilities.KubeVersion.Version (ne (toString $i.tag) "")) -}}
{{- if and $release (semverCompare ">=1.31.0-0" $release) -}}
/readyz
{{- else -}}
/healthz
{{- end -}}
{{- end -}}

{{/* The gpushare image: by image.digest when set (what cosign signed), else by tag. */}}
{{- define "gpushare.image" -}}
{{- $name := .Values.image.repository -}}
{{- with .Values.image.registry }}{{ $name = printf "%s/%s" . $name }}{{ end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $name .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $name (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Settings every gpushare component shares, as command-line arguments. Resource names are
passed only when they differ from ACK's, which every component defaults to. */}}
{{- define "gpushare.unitArgs" -}}
- --gpu-memory-unit={{ .Values.gpuMemoryUnit }}
{{- end -}}

{{- define "gpushare.maxPodsArgs" -}}
{{- if not (kindIs "invalid" .Values.maxPodsPerGpu) }}
- --max-pods-per-gpu={{ int .Values.maxPodsPerGpu }}
{{- end }}
{{- end -}}

{{- define "gpushare.resourceNameArgs" -}}
{{- $names := .Values.resourceNames -}}
{{- if ne $names.mem "aliyun.com/gpu-mem" }}
- --mem-resource={{ $names.mem }}
{{- end }}
{{- if ne $names.core "aliyun.com/gpu-core.percentage" }}
- --core-resource={{ $names.core }}
{{- end }}
{{- if ne $names.count "aliyun.com/gpu-count" }}
- --count-resource={{ $names.count }}
{{- end }}
{{- end -}}

{{/* A probe that runs inside a gpushare container (for servers bound to 127.0.0.1). */}}
{{- define "gpushare.execProbe" -}}
exec:
  command:
    - python
    - -c
    - "import sys, urllib.request; sys.exit(urllib.request.urlopen('{{ .url }}', timeout=3).status != 200)"
{{- end -}}

{{/* Components' names. */}}
{{- define "gpushare.scheduler.fullname" -}}{{ include "gpushare.fullname" . }}-scheduler{{- end -}}
{{- define "gpushare.devicePlugin.fullname" -}}{{ include "gpushare.fullname" . }}-device-plugin{{- end -}}
{{- define "gpushare.webhook.fullname" -}}{{ include "gpushare.fullname" . }}-webhook{{- end -}}
{{- define "gpushare.webhook.secretName" -}}
{{- default (printf "%s-tls" (include "gpushare.webhook.fullname" .)) .Values.webhook.certs.secretName -}}
{{- end -}}
{{- define "gpushare.webhook.certJobName" -}}{{ include "gpushare.fullname" . }}-webhook-certs{{- end -}}

{{/* A Job's name: its base (cut to 52 characters) and the first 10 hex digits of the SHA-256 of
its rendered spec (.spec), 63 characters at most, as the job-name label on its pods needs. The
same render gives the same name, so applying the chart again changes nothing; any change to the
spec gives a new name, so the changed Job is created and runs, never patched (a Job's template
is immutable). */}}
{{- define "gpushare.jobName" -}}
{{- printf "%s-%s" (.base | trunc 52 | trimSuffix "-") (.spec | sha256sum | trunc 10) -}}
{{- end -}}

{{/* Who may write gpushare.io/* and ALIYUN_COM_GPU_MEM_* pod annotations (and nodeName on GPU
pods), as a JSON list: the extender's and the device plugin's ServiceAccounts when this release
runs them, then webhook.trustedUsers. The webhook's flags, its matchConditions and the policy
all read this one list. */}}
{{- define "gpushare.webhook.trustedUsers" -}}
{{- $users := list -}}
{{- if .Values.scheduler.enabled -}}
{{- $users = append $users (printf "system:serviceaccount:%s:%s" .Release.Namespace (include "gpushare.scheduler.fullname" .)) -}}
{{- end -}}
{{- if .Values.devicePlugin.enabled -}}
{{- $users = append $users (printf "system:serviceaccount:%s:%s" .Release.Namespace (include "gpushare.devicePlugin.fullname" .)) -}}
{{- end -}}
{{- concat $users .Values.webhook.trustedUsers | uniq | toJson -}}
{{- end -}}

{{/* The matchCondition that leaves the trusted identities out (webhook/configuration.py
not_trusted); nothing when nobody is trusted. */}}
{{- define "gpushare.webhook.notTrusted" -}}
{{- $users := include "gpushare.webhook.trustedUsers" . | fromJsonArray -}}
{{- $groups := .Values.webhook.trustedGroups -}}
{{- $terms := list -}}
{{- if $users -}}
{{- $terms = append $terms (printf "!(request.userInfo.username in %s)" (toJson $users)) -}}
{{- end -}}
{{- if $groups -}}
{{- $terms = append $terms (printf "!request.userInfo.groups.exists(g, g in %s)" (toJson $groups)) -}}
{{- end -}}
{{- if $terms -}}
- name: not-trusted
  expression: {{ join " && " $terms | quote }}
{{- end -}}
{{- end -}}

{{/* Namespaces the webhook and the policy check: all but kube-system (and the other excluded
ones) and the release namespace, whose pods must start while the webhook cannot answer yet. */}}
{{/* CEL: the pod (`object`) asks for gpushare's memory or core share in a container or an init
container (webhook/configuration.py asks_gpushare). The policy and the steering webhook use it. */}}
{{- define "gpushare.asksGpushare" -}}
{{- include "gpushare.asksGpushareIn" (dict "root" . "spec" "object.spec") -}}
{{- end -}}

{{/* CEL: the pod spec `.spec` asks for gpushare's share (webhook/configuration.py
asks_gpushare_in). */}}
{{- define "gpushare.asksGpushareIn" -}}
{{- $r := printf "['%s', '%s']" .root.Values.resourceNames.mem .root.Values.resourceNames.core -}}
{{- $c := printf "has(c.resources) && %s.exists(r, (has(c.resources.limits) && r in c.resources.limits) || (has(c.resources.requests) && r in c.resources.requests))" $r -}}
{{ .spec }}.containers.exists(c, {{ $c }}) || (has({{ .spec }}.initContainers) && {{ .spec }}.initContainers.exists(c, {{ $c }}))
{{- end -}}

{{/* CEL: the pod spec of any kind the validating webhook is sent (webhook/configuration.py
POD_SPEC). */}}
{{- define "gpushare.podSpecCel" -}}
(object.kind == 'Pod' ? object.spec : object.kind == 'CronJob' ? object.spec.jobTemplate.spec.template.spec : object.spec.template.spec)
{{- end -}}

{{/* CEL: a container of the pod spec `.` sets NVIDIA_VISIBLE_DEVICES or an envFrom prefix
that can start it (webhook/configuration.py sets_nvidia_visible_devices). */}}
{{- define "gpushare.setsNvidiaVisibleDevices" -}}
{{- $e := "(has(c.env) && c.env.exists(e, e.name == 'NVIDIA_VISIBLE_DEVICES')) || (has(c.envFrom) && c.envFrom.exists(f, has(f.prefix) && f.prefix != '' && 'NVIDIA_VISIBLE_DEVICES'.startsWith(f.prefix)))" -}}
{{ . }}.containers.exists(c, {{ $e }}) || (has({{ . }}.initContainers) && {{ . }}.initContainers.exists(c, {{ $e }})) || (has({{ . }}.ephemeralContainers) && {{ . }}.ephemeralContainers.exists(c, {{ $e }}))
{{- end -}}

{{/* "true" when the webhook refuses NVIDIA_VISIBLE_DEVICES (webhook.nvidiaVisibleDevices:
refuse or auto; auto spares privileged containers under the cdi-cri hand-off). */}}
{{- define "gpushare.webhook.refusesNvidiaVisibleDevices" -}}
{{- $mode := .Values.webhook.nvidiaVisibleDevices | default "refuse" -}}
{{- ne $mode "allow" -}}
{{- end -}}

{{/* Namespaces where the webhook never refuses NVIDIA_VISIBLE_DEVICES: the release's first. */}}
{{- define "gpushare.webhook.nvidiaVisibleDevicesExempt" -}}
{{- prepend (.Values.webhook.nvidiaVisibleDevicesExemptNamespaces | default list) .Release.Namespace | uniq | toJson -}}
{{- end -}}

{{/* The validating webhook's matchCondition: only what gpushare must see is sent
(webhook/configuration.py must_see). */}}
{{- define "gpushare.webhook.mustSee" -}}
{{- $spec := include "gpushare.podSpecCel" . -}}
{{- $asks := include "gpushare.asksGpushareIn" (dict "root" . "spec" $spec) -}}
{{- if eq (include "gpushare.webhook.refusesNvidiaVisibleDevices" .) "true" -}}
{{ $asks }} || (!(request.namespace in {{ include "gpushare.webhook.nvidiaVisibleDevicesExempt" . }}) && ({{ include "gpushare.setsNvidiaVisibleDevices" $spec }}))
{{- else -}}
{{ $asks }}
{{- end -}}
{{- end -}}

{{- define "gpushare.webhook.namespaceSelector" -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values:
      {{- toYaml (uniq (concat .Values.webhook.excludedNamespaces (list .Release.Namespace))) | nindent 6 }}
  # An administrator's opt-out: a namespace labelled gpushare.io/webhook=skip is sent nothing.
  - key: gpushare.io/webhook
    operator: NotIn
    values: ["skip"]
{{- with .Values.webhook.namespaceLabels }}
matchLabels:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
{{- define "gpushare.seal.secretName" -}}
{{- default (printf "%s-seal" (include "gpushare.fullname" .)) .Values.seal.existingSecret -}}
{{- end -}}
{{/* Where the extender and the device plugin find the seal key (the Secret's data "key"). */}}
{{- define "gpushare.seal.dir" -}}/var/run/gpushare/seal{{- end -}}

{{/*
Test clusters only (values: testing.apiServer). Where no kube-proxy serves the kubernetes Service,
the pods that call the API run in the node's network namespace and are told the API server's
address directly (kubelet's KUBERNETES_SERVICE_* variables name the Service's ClusterIP, and a
container's own env wins over them).
*/}}
{{- define "gpushare.testing.hostNetwork" -}}
{{- if .Values.testing.apiServer }}
# testing.apiServer: the node's network, where the API server is reachable.
hostNetwork: true
{{- end }}
{{- end -}}

{{- define "gpushare.testing.apiEnv" -}}
{{- with .Values.testing.apiServer }}
{{- $host := regexReplaceAll ":[0-9]+$" . "" }}
{{- $port := regexFind "[0-9]+$" . }}
# testing.apiServer: the API server directly, not the kubernetes Service.
- name: KUBERNETES_SERVICE_HOST
  value: {{ $host | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ $port | quote }}
{{- end }}
{{- end -}}

{{/* The metrics port's access flags (metrics.authorization), for the extender and device plugin. */}}
{{- define "gpushare.metricsAccessArgs" -}}
{{- $a := .Values.metrics.authorization -}}
{{- if $a.enabled }}
# metrics.authorization: HTTPS, /metrics only for identities allowed get /metrics.
- --metrics-authorization
- --metrics-auth-cache-ttl={{ $a.cacheTTLSeconds }}
{{- else }}
# metrics.authorization.enabled=false: plain HTTP, /metrics to anyone who reaches the pod.
- --no-metrics-authorization
{{- end }}
{{- end -}}

{{/*
The platform preset (values: platform; docs/platforms.md). The values a preset may set are null
in values.yaml; this fills every such value that is still null or missing, first from
platforms/<platform>.yaml, then from platforms/generic.yaml (the built-in defaults). Both files
name each key by its dotted path, so a preset sets whole values, never parts of a map the user
gave. A value the user set (anything but null) is never touched, so it wins over the preset.

Helm gives every template the same values, so filling them in place once is enough, but the
order templates render in is Helm's: every template (or helper) that reads one of these keys
includes this first. It is idempotent. tests/integration/chart/test_platforms.py checks that
each template naming a preset key includes it.
*/}}
{{- define "gpushare.platform.resolve" -}}
{{- $sources := list -}}
{{- with .Values.platform -}}
{{- $sources = append $sources (printf "platforms/%s.yaml" .) -}}
{{- end -}}
{{- $sources = append $sources "platforms/generic.yaml" -}}
{{- range $sources -}}
{{- range $path, $value := ($.Files.Get . | fromYaml) -}}
{{- $node := $.Values -}}
{{- $parts := splitList "." $path -}}
{{- range initial $parts -}}
{{- if not (kindIs "map" (index $node .)) -}}
{{- $_ := set $node . dict -}}
{{- end -}}
{{- $node = index $node . -}}
{{- end -}}
{{- if kindIs "invalid" (index $node (last $parts)) -}}
{{- $_ := set $node (last $parts) $value -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The pod securityContext of the chart's non-root pods (scheduler, webhook, Jobs, test pods):
uid and gid 65532, and fsGroup too when .fsGroup. Under openshift.enabled none of them is fixed:
restricted-v2 assigns the namespace's range (and its fsGroup) and refuses fixed ones.
*/}}
{{- define "gpushare.podSecurityContext" -}}
{{- include "gpushare.platform.resolve" .root -}}
runAsNonRoot: true
{{- if not .root.Values.openshift.enabled }}
runAsUser: 65532
runAsGroup: 65532
{{- if .fsGroup }}
# The seal key's files belong to this group (mode 0440), readable by the extender only.
fsGroup: 65532
{{- end }}
{{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
Whether the extender allocates DRA claims (docs/dra.md): dra.allocator.enabled, which follows
dra.enabled when left unset (null). "true" or "".
*/}}
{{- define "gpushare.dra.allocator" -}}
{{- $dra := .Values.dra | default dict -}}
{{- $allocator := dig "allocator" "enabled" nil $dra -}}
{{- if kindIs "invalid" $allocator -}}{{- $allocator = dig "enabled" false $dra -}}{{- end -}}
{{- if $allocator -}}true{{- end -}}
{{- end -}}
