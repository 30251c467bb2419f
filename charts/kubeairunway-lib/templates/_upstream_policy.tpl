{{- /*
kubeairunway-lib.upstreamPolicy: a ValidatingAdmissionPolicy and its binding fencing a
provider's cluster-wide writes of what it renders. RBAC lets the provider write its kinds
in every namespace (a ModelDeployment's objects go in its namespace); the policy lets its
service account create only objects labelled kubeairunway.ai/provider=<provider> (the SDK
runtime labels everything a provider renders) with a controlling owner reference to a
ModelDeployment, change or delete only objects labelled so before the change, and write
none in the system namespaces or the release namespace. ValidatingAdmissionPolicy is GA
since Kubernetes 1.30.
Arguments: root (the chart's $), provider (its name), kinds (what the policy governs: a
description for its messages), resourceRules (its matchConstraints.resourceRules).
*/ -}}
{{- define "kubeairunway-lib.upstreamPolicy" -}}
{{- $root := .root -}}
{{- $ctx := dict "root" $root "values" $root.Values "component" "provider" "name" (include "kubeairunway-lib.fullname" $root) -}}
{{- $user := printf "system:serviceaccount:%s:%s" $root.Release.Namespace (include "kubeairunway-lib.serviceAccountName" $ctx) -}}
{{- $me := printf "%s-provider" .provider -}}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ $ctx.name }}-upstream
  labels:
    {{- include "kubeairunway-lib.labels" $ctx | nindent 4 }}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      {{- toYaml .resourceRules | nindent 6 }}
  matchConditions:
    - name: this-provider-only
      expression: >-
        request.userInfo.username == "{{ $user }}"
  variables:
    - name: label
      expression: '"kubeairunway.ai/provider"'
  validations:
    - expression: >-
        !(request.namespace in ["kube-system", "kube-public", "kube-node-lease", "{{ $root.Release.Namespace }}"])
      message: {{ $me }} never writes in kube-system, kube-public, kube-node-lease or its own namespace
    - expression: >-
        request.operation == "DELETE" ||
        (has(object.metadata.labels) && variables.label in object.metadata.labels &&
        object.metadata.labels[variables.label] == "{{ .provider }}")
      message: {{ $me }} writes only {{ .kinds }} labelled kubeairunway.ai/provider={{ .provider }}
    - expression: >-
        request.operation == "CREATE" ||
        (has(oldObject.metadata.labels) && variables.label in oldObject.metadata.labels &&
        oldObject.metadata.labels[variables.label] == "{{ .provider }}")
      message: {{ $me }} changes and deletes only the {{ .kinds }} it created
    - expression: >-
        request.operation != "CREATE" ||
        (has(object.metadata.ownerReferences) &&
          object.metadata.ownerReferences.exists(o, o.kind == "ModelDeployment" &&
            o.apiVersion.startsWith("kubeairunway.ai/") && has(o.controller) && o.controller))
      message: {{ $me }} creates only {{ .kinds }} controlled by a ModelDeployment
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ $ctx.name }}-upstream
  labels:
    {{- include "kubeairunway-lib.labels" $ctx | nindent 4 }}
spec:
  policyName: {{ $ctx.name }}-upstream
  validationActions: ["Deny"]
{{- end -}}
