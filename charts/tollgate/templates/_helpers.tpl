{{/* The name of every object: the release's, or "tollgate" when the release is called so. */}}
{{- define "tollgate.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tollgate.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tollgate.labels" -}}
{{ include "tollgate.selectorLabels" . }}
app.kubernetes.io/part-of: tollgate
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "tollgate.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The ConfigMap the container reads: the user's own, or the chart's. */}}
{{- define "tollgate.configMapName" -}}
{{- if eq .Values.mode "ratelimit" -}}
{{- .Values.ratelimit.existingConfigMap | default (printf "%s-rules" (include "tollgate.fullname" .)) -}}
{{- else -}}
{{- .Values.config.existingConfigMap | default (include "tollgate.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/*
The tollgate container. Its one argument is a dict: "root" (the chart's context) and
"sidecar" (true: a native sidecar of an ingress pod, /check on loopback, probed through the
admin listener).
*/}}
{{- define "tollgate.container" -}}
{{- $ := .root -}}
{{- $v := $.Values -}}
{{- $erl := eq $v.mode "ratelimit" -}}
name: tollgate
image: {{ include "tollgate.image" $ }}
imagePullPolicy: {{ $v.image.pullPolicy }}
{{- if .sidecar }}
restartPolicy: Always
{{- end }}
{{- if $erl }}
args: ["serve"]
{{- else }}
args: ["serve", "--config", "/etc/tollgate/tollgate.toml"]
{{- end }}
env:
{{- if .sidecar }}
  # Only the ingress in this pod may call /check: bind it to loopback.
  - name: TOLLGATE_LISTEN
    value: "127.0.0.1:{{ $v.ports.http }}"
{{- end }}
{{- if $erl }}
  # envoyproxy/ratelimit's environment: its YAML under RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config.
  - name: RUNTIME_ROOT
    value: /data
  - name: RUNTIME_SUBDIRECTORY
    value: ratelimit
  - name: PORT
    value: {{ $v.ports.http | quote }}
  - name: GRPC_PORT
    value: {{ $v.ports.grpc | quote }}
  - name: TOLLGATE_ADMIN_LISTEN
    value: "0.0.0.0:{{ $v.ports.metrics }}"
  # envoyproxy/ratelimit's statsd is on unless turned off; Prometheus replaces it here.
  - name: USE_STATSD
    value: "false"
{{- if $v.ratelimit.prometheus }}
  - name: USE_PROMETHEUS
    value: "true"
  - name: PROMETHEUS_ADDR
    value: ":{{ $v.ports.erlMetrics }}"
{{- end }}
  - name: REDIS_SOCKET_TYPE
    value: tcp
  - name: REDIS_URL
    valueFrom:
      secretKeyRef:
        name: {{ $v.redis.existingSecret }}
        key: {{ $v.redis.secretKey }}
{{- with $v.redis.authKey }}
  - name: REDIS_AUTH
    valueFrom:
      secretKeyRef:
        name: {{ $v.redis.existingSecret }}
        key: {{ . }}
{{- end }}
{{- range $name, $value := $v.ratelimit.env }}
  - name: {{ $name }}
    value: {{ $value | toString | quote }}
{{- end }}
{{- else }}
  - name: TOLLGATE_STORE__URL
    valueFrom:
      secretKeyRef:
        name: {{ $v.redis.existingSecret }}
        key: {{ $v.redis.secretKey }}
{{- if and $v.grpc.enabled (not .sidecar) }}
  - name: TOLLGATE_GRPC_LISTEN
    value: "0.0.0.0:{{ $v.ports.grpc }}"
{{- end }}
{{- end }}
{{- with $v.adminToken.existingSecret }}
  - name: TOLLGATE_ADMIN_TOKEN
    valueFrom:
      secretKeyRef:
        name: {{ . }}
        key: {{ $v.adminToken.secretKey }}
{{- end }}
{{- with $v.clientIp.trustedProxies }}
  # Whose X-Forwarded-For tollgate believes, over the config's [client_ip].trusted_proxies.
  - name: TOLLGATE_CLIENT_IP__TRUSTED_PROXIES
    value: {{ toJson . | quote }}
{{- end }}
{{- with $v.extraEnv }}
{{ toYaml . | indent 2 }}
{{- end }}
ports:
{{- if not .sidecar }}
  - name: http
    containerPort: {{ $v.ports.http }}
    protocol: TCP
{{- end }}
  - name: metrics
    containerPort: {{ $v.ports.metrics }}
    protocol: TCP
{{- if or $erl (and $v.grpc.enabled (not .sidecar)) }}
  - name: grpc
    containerPort: {{ $v.ports.grpc }}
    protocol: TCP
{{- end }}
{{- if and $erl $v.ratelimit.prometheus }}
  - name: erl-metrics
    containerPort: {{ $v.ports.erlMetrics }}
    protocol: TCP
{{- end }}
{{- /* /check listens on loopback in a sidecar: probe the admin listener, which serves the same paths. */}}
{{- $probePort := ternary "metrics" "http" (eq .sidecar true) }}
startupProbe:
  httpGet:
    path: /healthz
    port: {{ $probePort }}
  periodSeconds: 1
  failureThreshold: 30
# /healthz never looks at Redis, so a Redis outage never restarts tollgate.
livenessProbe:
  httpGet:
    path: /healthz
    port: {{ $probePort }}
  periodSeconds: 10
  timeoutSeconds: 2
  failureThreshold: 3
# /readyz fails only when tollgate cannot decide (Redis down with on_error = "deny").
readinessProbe:
  httpGet:
    path: /readyz
    port: {{ $probePort }}
  periodSeconds: 5
  timeoutSeconds: 2
  failureThreshold: 2
{{- if not .sidecar }}
lifecycle:
  # Keep serving while the endpoint leaves the Service; SIGTERM then drains what is in
  # flight. The sleep action needs Kubernetes >= 1.30 (the image has no shell).
  preStop:
    sleep:
      seconds: 5
{{- end }}
resources:
{{ toYaml (ternary $v.sidecar.resources $v.resources (eq .sidecar true)) | indent 2 }}
securityContext:
{{ toYaml $v.securityContext | indent 2 }}
volumeMounts:
{{- if $erl }}
  - name: rules
    mountPath: /data/ratelimit/config
    readOnly: true
{{- else }}
  - name: {{ if .sidecar }}tollgate-config{{ else }}config{{ end }}
    mountPath: /etc/tollgate
    readOnly: true
{{- end }}
{{- end -}}

{{/*
The standalone mode is called by other pods (an ingress): with the chart's config, which
trusts only loopback, every client would be keyed on the calling pod's address, and share
one per-ip bucket. Refused until clientIp.trustedProxies says whom to trust, unless the
config is the user's own.
*/}}
{{- define "tollgate.checkTrustedProxies" -}}
{{- $v := .Values -}}
{{- $loopbackOnly := contains "trusted_proxies = [\"127.0.0.0/8\", \"::1/128\"]" $v.config.toml -}}
{{- if and (eq $v.mode "standalone") (not $v.clientIp.trustedProxies) (not $v.config.existingConfigMap) $loopbackOnly -}}
{{- fail "clientIp.trustedProxies: the standalone mode is called by your ingress pods, and config.toml trusts X-Forwarded-For from loopback only, so every client would share the ingress pod's per-ip bucket. Set the ingress pods' CIDR (their pod network; add any load balancer in front that adds X-Forwarded-For), e.g. --set 'clientIp.trustedProxies={10.244.0.0/16}', or give config.toml a [client_ip] of your own." -}}
{{- end -}}
{{- end -}}
