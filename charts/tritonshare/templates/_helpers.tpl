{{/*
Labels Helm conventionally puts on every object the release owns. Selectors never use them, so an
upgrade that changes the chart's version never changes an immutable selector.
*/}}
{{- define "tritonshare.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
Where a Deployment's pods run and what they carry, from a component's values (nodeSelector,
tolerations, affinity, podAnnotations): .values is the component's values, .affinity the
default affinity (YAML) used when the values set none.
*/}}
{{- define "tritonshare.podPlacement" -}}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .values.affinity }}
affinity:
  {{- toYaml .values.affinity | nindent 2 }}
{{- else if .affinity }}
affinity:
  {{- .affinity | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The tritonshare image, tag defaulting to the chart's appVersion. */}}
{{- define "tritonshare.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* Pull policy and pull secrets of a pod spec's tritonshare containers, when set. */}}
{{- define "tritonshare.pullPolicy" -}}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end -}}

{{/* The service account user name the API server gives a tritonshare component. */}}
{{- define "tritonshare.user" -}}
system:serviceaccount:{{ .root.Release.Namespace }}:tritonshare-{{ .component }}
{{- end -}}

{{/* A contract key: the key prefix and a name (keyPrefix is validated by values.schema.json). */}}
{{- define "tritonshare.key" -}}
{{ .root.Values.keyPrefix }}{{ .name }}
{{- end -}}

{{/* The Prometheus meta label Kubernetes service discovery makes of the model-id annotation. */}}
{{- define "tritonshare.modelIdMetaLabel" -}}
__meta_kubernetes_pod_annotation_{{ regexReplaceAll "[^a-zA-Z0-9_]" (printf "%smodel-id" .Values.keyPrefix) "_" }}
{{- end -}}

{{/* Flags every part shares, from the values. */}}
{{- define "tritonshare.commonArgs" -}}
- --key-prefix={{ .Values.keyPrefix }}
- --system-namespace={{ .Release.Namespace }}
- --scheduler-name={{ .Values.schedulerName }}
{{- end -}}

{{/*
A Secret's key: kept from the live Secret on upgrades (lookup), random on first install.
Offline renders (helm template) have no live Secret and get a new random key each time.
*/}}
{{- define "tritonshare.keepOrRandom" -}}
{{- $live := lookup "v1" "Secret" .root.Release.Namespace .name -}}
{{- if and $live $live.data (hasKey $live.data .key) -}}
{{ index $live.data .key }}
{{- else -}}
{{ randAlphaNum 48 | b64enc }}
{{- end -}}
{{- end -}}
