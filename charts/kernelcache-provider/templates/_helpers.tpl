{{/* Names and labels of the kernel-cache chart's objects, from the library chart
(kubeairunway-lib). */}}
{{- define "kernelcache-provider.fullname" -}}
{{- include "kubeairunway-lib.fullname" . -}}
{{- end -}}

{{/* Labels without the component (the templates add app.kubernetes.io/component). */}}
{{- define "kernelcache-provider.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "kubeairunway-lib.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kubeairunway
{{- end -}}

{{/* Selector labels of one component: include with (list $ "controller"). */}}
{{- define "kernelcache-provider.selectorLabels" -}}
{{- include "kubeairunway-lib.selectorLabels" (dict "root" (index . 0) "component" (index . 1)) -}}
{{- end -}}

{{- define "kernelcache-provider.image" -}}
{{- include "kubeairunway-lib.image" . -}}
{{- end -}}

